// The wire guard: what one connection's peer may write, checked on the bytes before CAF
// reads them. CAF 0.17.6's BASP authenticates nothing after the TLS handshake: a peer
// names any actor id, routes messages through this node with a source node of its choice,
// announces the death of another node's actors, asks for named system actors and
// announces payloads of up to 4 GiB, which CAF allocates before a byte arrives. The guard
// parses the inbound stream frame by frame (a frame split over many reads, several frames
// in one read) and refuses, for good, the first frame that breaks a rule:
//   - the peer's handshake comes first, and names a node id that is not this node's and
//     that the caller's `claim` admits (the TLS layer binds node ids to certificates);
//     repeated handshakes name the same node;
//   - only direct messages (from the peer's node to this one by construction) and
//     heartbeats after it: no routed messages;
//   - monitor and down messages only from the peer's own node, about this node;
//   - a direct message to a named actor only to the names the policy allows (SpawnServ),
//     and no link or unlink message (a linked proxy kills the local actor when its
//     connection ends);
//   - no payload above the policy's cap.
// Plain C++ without sockets or CAF: the formats are CAF 0.17.6's binary serializer
// (integers in network order, sequence sizes as varbytes), written down in the unit tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cafhvd::wire {

/// BASP's operations (caf/io/basp/message_type.hpp).
enum class basp_op : uint8_t {
  server_handshake = 0,
  client_handshake = 1,
  direct_message = 2,
  routed_message = 3,
  monitor_message = 4,
  down_message = 5,
  heartbeat = 6,
};

inline constexpr size_t basp_header_size = 32;
inline constexpr uint8_t named_receiver_flag = 0x01;
inline constexpr uint8_t select_connection_flag = 0x02;

/// What every connection of a process is held to.
struct guard_policy {
  uint64_t max_payload = 0;           // bytes; larger frames are refused before CAF allocates
  std::string this_node;              // this process's node id, serialized
  std::vector<uint64_t> named_actors; // atom values a direct message may name (SpawnServ)
  uint64_t link_atom = 0;             // CAF's link_atom and unlink_atom values
  uint64_t unlink_atom = 0;
};

/// CAF's atom encoding of `name` (at most 10 characters of [0-9A-Za-z_ ]), as CAF's
/// atom() computes it.
uint64_t atom_value(std::string_view name);

/// One connection's inbound stream.
class basp_guard {
public:
  /// Called once per handshake with the node id the peer claims (serialized): "" admits
  /// it, anything else is the refusal.
  using claim_fn = std::function<std::string(const std::string& node)>;

  /// `server`: this end accepted the connection (the peer's handshake is a client's).
  basp_guard(const guard_policy& policy, bool server, claim_fn claim = {});

  /// Takes the next `n` bytes of the stream. Returns "" while every frame keeps the
  /// rules, else the rule the first offending frame broke (also on every later call).
  /// A refusal comes no later than the call that holds the frame's last byte, so a
  /// caller that drops the bytes of a refused call never lets CAF act on that frame.
  const std::string& feed(const uint8_t* data, size_t n);
  const std::string& feed(std::string_view bytes) {
    return feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }

  const std::string& refusal() const { return refused_; }
  /// The node id the peer's handshake named (serialized), empty before it.
  const std::string& peer_node() const { return peer_; }
  uint64_t frames() const { return frames_; }
  /// The application ids of the accepting end's handshake (this end connected), as far
  /// as they parsed; empty before it.
  const std::vector<std::string>& peer_applications() const { return peer_apps_; }

private:
  void on_header();
  void on_prefix(bool complete);
  void refuse(std::string why);

  const guard_policy& policy_;
  bool server_;
  claim_fn claim_;
  std::string refused_;
  std::string peer_;
  std::vector<std::string> peer_apps_;
  uint64_t frames_ = 0;
  // the frame being read
  uint8_t header_[basp_header_size] = {};
  size_t header_have_ = 0;
  basp_op op_ = basp_op::heartbeat;
  uint8_t flags_ = 0;
  uint64_t payload_left_ = 0; // payload bytes still to come
  uint64_t payload_len_ = 0;
  uint64_t dest_actor_ = 0;
  bool deciding_ = false; // the payload's prefix is still needed for a decision
  std::string prefix_;    // the payload's first bytes while deciding
};

/// The parts of a serialized node id (CAF: an atom naming the kind, then pid and host
/// hash, or a URI): the number of bytes it takes at the start of `in`, 0 when `in` is too
/// short to tell, or -1 when it is no node id.
long node_id_size(std::string_view in);

} // namespace cafhvd::wire
