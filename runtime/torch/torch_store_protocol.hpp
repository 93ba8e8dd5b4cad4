// torch.distributed's TCPStore protocol as a pure state machine: bytes in from each
// client connection, replies (and wake-ups of waiting connections) out. No sockets, so
// both dialects are tested byte for byte and fuzzed; runtime/torch/torch_store runs it on
// Boost.Asio.
//
// Dialects, read from pytorch's torch/csrc/distributed/c10d/TCPStore.{hpp,cpp},
// TCPStoreBackend.{hpp,cpp} and TCPStoreLibUvBackend.cpp at the tags v1.13.1 and
// v2.6.0 (source tarballs), and main-branch versions for what came after (queues in
// v2.8, LIST_KEYS in v2.10, BARRIER on main):
//   legacy   (v1.13, v2.0): no handshake; SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5
//            GETNUMKEYS=6 WATCH_KEY=7 DELETE_KEY=8
//   legacy21 (v2.1): no handshake; WATCH_KEY gone, so DELETE_KEY=7 APPEND=8 MULTI_GET=9
//            MULTI_SET=10 CANCEL_WAIT=11
//   modern   (v2.2 and later): VALIDATE=0 with the uint32 magic 0x3C85F7CE first (no
//            reply), SET=1 ... CANCEL_WAIT=12, PING=13 (v2.5: the uint32 nonce is
//            echoed), QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16 (v2.8), LIST_KEYS=17
//            (v2.10), BARRIER=18 (main)
// Every field is raw host order (little-endian here); strings and values are a uint64
// length and the bytes; replies are uint8 codes, int64 numbers or length-prefixed bytes.
//
// Telling them apart: a modern client's first five bytes are 00 CE F7 85 3C. Read as a
// legacy SET, those would start a key longer than 1 GB, which no store accepts, so the
// two never collide. v1.13/v2.0 and v2.1 differ only in codes 7 and up: 9-11 exist only
// in v2.1; 7 is taken as v2.1's DELETE_KEY (v1.13's WATCH_KEY needs a callback channel
// this store does not serve); 8 is v2.1's APPEND when its value follows in the same read
// (a v1.13 client sends nothing after DELETE_KEY's key until the reply) and v1.13's
// DELETE_KEY otherwise. The first of these decides the connection's dialect.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cafhvd {

enum class torch_dialect : uint8_t {
  unknown,    // no query yet
  legacy_any, // no handshake; only codes torch 1.13, 2.0 and 2.1 share so far
  legacy,     // torch 1.13 / 2.0
  legacy21,   // torch 2.1
  modern,     // torch 2.2 and later (validated)
};

const char* to_string(torch_dialect d);

struct torch_store_limits {
  uint64_t max_key = 64u << 10;         // bytes in one key
  uint64_t max_value = 64u << 20;       // bytes in one value
  uint64_t max_keys_per_query = 131072; // CHECK, WAIT, MULTI_GET, MULTI_SET
  size_t max_buffered = 128u << 20;     // one connection's unparsed input
  // The job's budget over every key and queued item (a client past it is closed, the
  // store and the job's other clients go on):
  uint64_t max_total = 512u << 20; // bytes of keys and values
  uint64_t max_keys = 1u << 20;    // keys plus queued items
  size_t max_connections_per_client = 1024; // open connections of one address
  bool loopback_exempt = true; // the driver's own host; tests turn it off
};

class torch_store_core {
public:
  using conn_id = uint64_t;

  struct send {
    conn_id conn;
    std::string bytes;
  };

  struct result {
    std::vector<send> sends; // in order; may name connections other than the one fed
    bool close = false;      // the fed connection must be closed
    std::string problem;     // why, when closed for a protocol violation
  };

  explicit torch_store_core(torch_store_limits limits = {}) : limits_(limits) {}

  void connect(conn_id c);
  /// Forgets the connection and its waits.
  void disconnect(conn_id c);
  /// Bytes that arrived on `c` (which must be connected); answers every complete query.
  result feed(conn_id c, std::string_view bytes);
  /// A fresh key space (a new generation): drops every key and queue. Connections and
  /// their pending waits stay; they are woken by keys set from now on.
  void clear();

  torch_dialect dialect(conn_id c) const;
  size_t key_count() const { return data_.size(); }
  uint64_t stored_bytes() const { return bytes_; }
  size_t connection_count() const { return conns_.size(); }
  size_t waiting_count() const;

private:
  struct connection {
    std::string in;
    torch_dialect dialect = torch_dialect::unknown;
    std::set<std::string> awaiting; // keys a pending WAIT (or BARRIER) still needs
    bool waiting = false;
  };
  enum class op;
  struct cursor;
  enum class step { done, need_more, fail };

  step one_query(conn_id c, connection& cn, cursor& cur, result& out);
  op decode(connection& cn, uint8_t code, const cursor& cur, bool& known);
  bool present(const std::string& key) const;
  void wait_for(conn_id c, connection& cn, const std::vector<std::string>& keys, result& out);
  void key_changed(const std::string& key, result& out);
  void queue_pushed(const std::string& key, result& out);
  void cancel_wait(conn_id c, connection& cn);
  // Every change to data_ and queues_ goes through these, which keep the budget.
  void assign(const std::string& key, std::string value);
  size_t erase(const std::string& key);
  void charge(uint64_t add_bytes, uint64_t add_items, const std::string& key);

  torch_store_limits limits_;
  std::unordered_map<conn_id, connection> conns_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::deque<std::string>> queues_;
  uint64_t bytes_ = 0; // keys and values in data_, queued items with their keys
  uint64_t items_ = 0; // keys in data_ plus queued items
  std::map<std::string, std::vector<conn_id>> waiters_; // key -> connections, in order
};

} // namespace cafhvd
