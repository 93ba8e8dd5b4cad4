// Fuzz target: what a Horovod worker (or anyone who reaches the rendezvous port or
// answers a notification) can send us. The first byte picks the door: 0 a PUT
// /worker_addresses body (base64), 1 the pickle itself (also fed again as base64, which
// must decide the same), 2 a framed answer (HMAC, length, body) and its AckResponse check.
// An accepted registration must hold what the decoder promises; a verified frame must
// re-frame to exactly its bytes.
#include <arpa/inet.h>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "runtime/horovod/horovod_wire.hpp"

namespace {

std::string base64(std::string_view in) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size())
      v |= static_cast<uint8_t>(in[i + 1]) << 8;
    if (i + 2 < in.size())
      v |= static_cast<uint8_t>(in[i + 2]);
    out += digits[v >> 18];
    out += digits[(v >> 12) & 63];
    out += i + 1 < in.size() ? digits[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? digits[v & 63] : '=';
  }
  return out;
}

void check(const cafhvd::decoded_registration& d) {
  using L = cafhvd::registration_limits;
  if (d.value.has_value() == !d.error.empty())
    __builtin_trap(); // exactly one of value and error
  if (!d.value)
    return;
  const auto& r = *d.value;
  if (r.key.empty() || r.key.size() > L::max_key || r.addresses.size() > L::max_interfaces)
    __builtin_trap();
  size_t total = 0;
  std::set<std::string> names;
  for (const auto& [iface, addrs] : r.addresses) {
    if (iface.empty() || iface.size() > L::max_interface_name || !names.insert(iface).second)
      __builtin_trap();
    for (char c : iface)
      if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f)
        __builtin_trap();
    for (const auto& [ip, port] : addrs) {
      unsigned char buf[16];
      if (port == 0
          || (::inet_pton(AF_INET, ip.c_str(), buf) != 1
              && ::inet_pton(AF_INET6, ip.c_str(), buf) != 1))
        __builtin_trap();
      ++total;
    }
  }
  if (total == 0 || total > L::max_addresses)
    __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  std::string_view in{reinterpret_cast<const char*>(data) + 1, size - 1};
  switch (data[0] % 3) {
    case 0: check(cafhvd::decode_worker_registration(in)); break;
    case 1: {
      auto d = cafhvd::decode_worker_registration_pickle(in);
      check(d);
      if (in.size() > cafhvd::registration_limits::max_pickle)
        break;
      auto again = cafhvd::decode_worker_registration(base64(in));
      if (d.error != again.error || d.value.has_value() != again.value.has_value()
          || (d.value
              && (d.value->key != again.value->key
                  || d.value->addresses != again.value->addresses)))
        __builtin_trap();
      break;
    }
    case 2: {
      static const std::string key(32, 'k');
      auto f = cafhvd::parse_framed_message(key, in, 4096);
      if (f.what == cafhvd::parsed_frame::status::complete) {
        if (cafhvd::frame_message(key, f.body) != in.substr(0, f.used))
          __builtin_trap();
      } else if (!f.body.empty() || f.used != 0) {
        __builtin_trap();
      }
      // The body check, on the raw bytes too (a digest is rarely right by chance).
      (void)cafhvd::check_ack_response(in);
      break;
    }
  }
  return 0;
}
