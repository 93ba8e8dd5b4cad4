// The wire guard's frame parser (runtime/network/basp_guard.hpp).
#include "runtime/network/basp_guard.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace cafhvd::wire {

namespace {

// The most of a payload read before deciding: a handshake's node id, a monitor or down
// message's two node ids, a direct message's forwarding stack and its content's type.
constexpr size_t prefix_cap = 4096;

// CAF's type name of (atom_value, strong_actor_ptr): the shape it intercepts as a link.
constexpr std::string_view link_type = "@<>+@atom+@strong_actor_ptr";

uint64_t be64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i)
    x = (x << 8) | p[i];
  return x;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// A varbyte sequence size at `in[at]`: its value and the bytes it takes, 0 bytes when
// `in` ends first, -1 when it is longer than CAF writes (5 bytes for 32 bits).
struct varbyte {
  uint64_t value = 0;
  long size = 0;
};

varbyte read_varbyte(std::string_view in, size_t at) {
  varbyte v;
  for (int n = 0; n < 5; ++n) {
    if (at + n >= in.size())
      return {0, 0};
    auto b = static_cast<uint8_t>(in[at + n]);
    v.value |= uint64_t{b & 0x7fu} << (7 * n);
    if (!(b & 0x80)) {
      v.size = n + 1;
      return v;
    }
  }
  return {0, -1};
}

// A sequence of strings at the start of `in` (CAF's std::vector<std::string>): 1 and
// `out` when it parses, 0 when `in` ends first, -1 when it is no such sequence (or more
// than a handshake's application ids would hold).
int read_strings(std::string_view in, std::vector<std::string>& out) {
  size_t at = 0;
  auto count = read_varbyte(in, at);
  if (count.size <= 0)
    return static_cast<int>(count.size);
  if (count.value > 64)
    return -1;
  at += count.size;
  std::vector<std::string> xs;
  for (uint64_t i = 0; i < count.value; ++i) {
    auto len = read_varbyte(in, at);
    if (len.size <= 0)
      return static_cast<int>(len.size);
    if (len.value > 1024)
      return -1;
    at += len.size;
    if (at + len.value > in.size())
      return 0;
    xs.emplace_back(in.substr(at, len.value));
    at += len.value;
  }
  out = std::move(xs);
  return 1;
}

const uint64_t default_kind = atom_value("default");
const uint64_t no_kind = atom_value("");

std::string op_name(uint8_t op) {
  static const char* names[] = {"server handshake", "client handshake", "direct message",
                                "routed message",   "monitor message",  "down message",
                                "heartbeat"};
  return op < 7 ? names[op] : fmt::format("unknown operation {}", op);
}

} // namespace

uint64_t atom_value(std::string_view name) {
  uint64_t x = 0xF;
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    uint64_t code = 0;
    if (u >= '0' && u <= '9')
      code = u - '0' + 1;
    else if (u >= 'A' && u <= 'Z')
      code = u - 'A' + 11;
    else if (u == '_')
      code = 37;
    else if (u >= 'a' && u <= 'z')
      code = u - 'a' + 38;
    x = (x << 6) | code;
  }
  return x;
}

long node_id_size(std::string_view in) {
  if (in.size() < 8)
    return 0;
  auto kind = be64(reinterpret_cast<const uint8_t*>(in.data()));
  if (kind == no_kind)
    return 8;
  if (kind != default_kind)
    return -1; // CAF's URI node ids: no caf-hvd process has one
  return in.size() < 32 ? 0 : 32;
}

basp_guard::basp_guard(const guard_policy& policy, bool server, claim_fn claim)
    : policy_(policy), server_(server), claim_(std::move(claim)) {}

void basp_guard::refuse(std::string why) {
  if (refused_.empty())
    refused_ = std::move(why);
}

const std::string& basp_guard::feed(const uint8_t* p, size_t n) {
  while (n > 0 && refused_.empty()) {
    if (header_have_ < basp_header_size) {
      auto take = std::min(n, basp_header_size - header_have_);
      std::memcpy(header_ + header_have_, p, take);
      header_have_ += take;
      p += take;
      n -= take;
      if (header_have_ == basp_header_size)
        on_header();
      continue;
    }
    auto take = static_cast<size_t>(std::min<uint64_t>(n, payload_left_));
    if (deciding_) {
      auto keep = std::min(take, prefix_cap - prefix_.size());
      prefix_.append(reinterpret_cast<const char*>(p), keep);
      on_prefix(prefix_.size() == payload_len_ || prefix_.size() >= prefix_cap);
    }
    payload_left_ -= take;
    p += take;
    n -= take;
    if (payload_left_ == 0 && refused_.empty()) {
      header_have_ = 0; // the next frame
      ++frames_;
    }
  }
  return refused_;
}

void basp_guard::on_header() {
  auto op = header_[0];
  flags_ = header_[3];
  payload_len_ = be32(header_ + 4);
  auto op_data = be64(header_ + 8);
  auto source_actor = be64(header_ + 16);
  dest_actor_ = be64(header_ + 24);
  payload_left_ = payload_len_;
  prefix_.clear();
  deciding_ = false;
  if (op > static_cast<uint8_t>(basp_op::heartbeat))
    return refuse(fmt::format("a frame of unknown operation {}", op));
  op_ = static_cast<basp_op>(op);
  auto expected = server_ ? basp_op::client_handshake : basp_op::server_handshake;
  if (peer_.empty() && op_ != expected)
    return refuse(fmt::format("a {} before its handshake", op_name(op)));
  if (payload_len_ > policy_.max_payload)
    return refuse(fmt::format("a {} of {} bytes, above the cap of {} bytes", op_name(op),
                              payload_len_, policy_.max_payload));
  if ((flags_ & named_receiver_flag) && op_ != basp_op::direct_message)
    return refuse(fmt::format("a {} with the named-receiver flag", op_name(op)));
  switch (op_) {
  case basp_op::server_handshake:
  case basp_op::client_handshake:
    if (op_ != expected)
      return refuse(fmt::format("a {} from the {} end", op_name(op),
                                server_ ? "connecting" : "accepting"));
    if (op_ == basp_op::server_handshake && !peer_.empty())
      return refuse("a second server handshake");
    if (op_ == basp_op::server_handshake && op_data == 0)
      return refuse("a server handshake without a protocol version");
    if (op_ == basp_op::client_handshake && (source_actor != 0 || dest_actor_ != 0))
      return refuse("a client handshake that names actors");
    if (payload_len_ == 0)
      return refuse(fmt::format("a {} without a node id", op_name(op)));
    deciding_ = true;
    return;
  case basp_op::direct_message:
    if (dest_actor_ == 0 || payload_len_ == 0)
      return refuse("a direct message without a receiver or content");
    if (flags_ & named_receiver_flag) {
      auto& ok = policy_.named_actors;
      if (std::find(ok.begin(), ok.end(), dest_actor_) == ok.end())
        return refuse("a direct message to a named actor other than the spawn server");
    }
    deciding_ = true;
    return;
  case basp_op::routed_message:
    return refuse("a routed message: this node forwards nothing and takes messages only "
                  "from its peer's own node");
  case basp_op::monitor_message:
  case basp_op::down_message:
    if (payload_len_ == 0 || op_data != 0)
      return refuse(fmt::format("a malformed {}", op_name(op)));
    deciding_ = true;
    return;
  case basp_op::heartbeat:
    if (payload_len_ != 0 || source_actor != 0 || dest_actor_ != 0 || op_data != 0)
      return refuse("a heartbeat with content");
    ++frames_;
    header_have_ = 0;
    return;
  }
}

// Decides on the frame once its payload's first bytes are in (`final`: no more will
// come before the decision must be made).
void basp_guard::on_prefix(bool final) {
  std::string_view in = prefix_;
  auto undecided = [&](const char* what) {
    if (final)
      refuse(fmt::format("a {} whose {} does not parse", op_name(static_cast<uint8_t>(op_)),
                         what));
  };
  auto decided = [&] {
    deciding_ = false;
    prefix_.clear();
    prefix_.shrink_to_fit();
  };
  switch (op_) {
  case basp_op::server_handshake:
  case basp_op::client_handshake: {
    auto size = node_id_size(in);
    if (size < 0 || size == 8)
      return refuse(fmt::format("a {} without a valid node id",
                                op_name(static_cast<uint8_t>(op_))));
    if (size == 0)
      return undecided("node id");
    std::string node{in.substr(0, size)};
    if (node == policy_.this_node)
      return refuse("a handshake claiming this node's own id");
    if (!peer_.empty()) {
      if (node != peer_)
        return refuse("a repeated handshake claiming another node id");
      return decided();
    }
    if (op_ == basp_op::server_handshake) {
      // the accepting end's application ids follow (CAF compares them with its own): kept
      // so that a refusal can name both versions; one that does not parse is CAF's to
      // refuse
      auto got = read_strings(in.substr(size), peer_apps_);
      if (got == 0 && !final)
        return; // more bytes to come
    }
    if (claim_)
      if (auto why = claim_(node); !why.empty())
        return refuse(why);
    peer_ = std::move(node);
    return decided();
  }
  case basp_op::monitor_message:
  case basp_op::down_message: {
    auto what = op_ == basp_op::down_message ? "down message" : "monitor message";
    auto source = node_id_size(in);
    if (source < 0)
      return refuse(fmt::format("a {} with a malformed node id", what));
    if (source == 0)
      return undecided("source node");
    auto dest = node_id_size(in.substr(source));
    if (dest < 0)
      return refuse(fmt::format("a {} with a malformed node id", what));
    if (dest == 0)
      return undecided("destination node");
    if (in.substr(0, source) != peer_)
      return refuse(fmt::format("a {} about another node than the peer's own", what));
    if (in.substr(source, dest) != policy_.this_node)
      return refuse(fmt::format("a {} for another node than this one", what));
    return decided();
  }
  case basp_op::direct_message: {
    // the forwarding stack: a sequence of actor handles (id, node id)
    size_t at = 0;
    auto count = read_varbyte(in, at);
    if (count.size < 0)
      return refuse("a direct message with a malformed forwarding stack");
    if (count.size == 0)
      return undecided("forwarding stack");
    at += count.size;
    for (uint64_t i = 0; i < count.value; ++i) {
      if (in.size() < at + 8)
        return undecided("forwarding stack");
      auto node = node_id_size(in.substr(at + 8));
      if (node < 0)
        return refuse("a direct message with a malformed forwarding stack");
      if (node == 0)
        return undecided("forwarding stack");
      at += 8 + node;
    }
    // the content: a uint16 (0), its type name, then its elements
    if (in.size() < at + 2)
      return undecided("content");
    at += 2;
    auto name = read_varbyte(in, at);
    if (name.size < 0)
      return refuse("a direct message with a malformed content type");
    if (name.size == 0)
      return undecided("content");
    at += name.size;
    if (name.value != link_type.size())
      return decided();
    if (in.size() < at + link_type.size())
      return undecided("content");
    if (in.substr(at, link_type.size()) != link_type)
      return decided();
    at += link_type.size();
    if (in.size() < at + 8)
      return undecided("content");
    auto atom = be64(reinterpret_cast<const uint8_t*>(in.data() + at));
    if (atom == policy_.link_atom || atom == policy_.unlink_atom)
      return refuse("a link or unlink message: no peer links this node's actors to its own");
    return decided();
  }
  default:
    return decided();
  }
}

} // namespace cafhvd::wire
