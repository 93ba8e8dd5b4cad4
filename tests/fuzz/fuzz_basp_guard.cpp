// Fuzz target: the wire guard's BASP parser (runtime/network/basp_guard.hpp). The input is
// fed in chunks whose sizes come from its first byte; the verdict must not depend on how
// the stream is cut (the same refusal, or none, as when fed whole), a refused guard stays
// refused, and no frame is counted past a refusal.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/network/basp_guard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cafhvd::wire;
  if (size == 0)
    return 0;
  static const guard_policy policy = [] {
    guard_policy p;
    p.max_payload = 1 << 16;
    // a node id of CAF's default kind: atom("default"), pid 1, a host hash of 0x11
    p.this_node = std::string(32, '\x11');
    auto kind = atom_value("default");
    for (int i = 0; i < 8; ++i)
      p.this_node[i] = static_cast<char>(kind >> (56 - 8 * i));
    p.named_actors = {atom_value("SpawnServ")};
    p.link_atom = atom_value("link");
    p.unlink_atom = atom_value("unlink");
    return p;
  }();
  bool server = data[0] & 0x80;
  size_t chunk = data[0] % 37 + 1;
  std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto claim = [](const std::string& node) {
    return node.size() > 20 && node[20] == '\x66' ? std::string{"bound elsewhere"}
                                                  : std::string{};
  };
  basp_guard whole{policy, server, claim};
  auto expected = whole.feed(stream);
  basp_guard cut{policy, server, claim};
  std::string got;
  for (size_t off = 0; off < stream.size(); off += chunk) {
    got = cut.feed(stream.substr(off, chunk));
    if (!got.empty())
      break;
  }
  if (got != expected || cut.refusal() != expected)
    std::abort();
  if (!expected.empty()) {
    auto frames = whole.frames();
    if (whole.feed(std::string(64, '\0')) != expected || whole.frames() != frames)
      std::abort();
  }
  return 0;
}
