// Fuzz target: the torch store's protocol state machine, both dialects. The input is a
// script: each step names a connection (3 of them) and a chunk of bytes to feed it, so
// queries arrive split and interleaved, waits and wake-ups cross connections, and a
// closed connection is replaced by a new one. Small limits make the limit paths
// reachable.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/torch/torch_store_protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cafhvd::torch_store_limits limits;
  limits.max_key = 64;
  limits.max_value = 256;
  limits.max_keys_per_query = 8;
  limits.max_buffered = 1024;
  cafhvd::torch_store_core core{limits};
  uint64_t ids[3] = {1, 2, 3};
  uint64_t next = 4;
  for (auto id : ids)
    core.connect(id);
  size_t pos = 0;
  while (pos + 2 <= size) {
    uint8_t control = data[pos];
    size_t len = data[pos + 1] % 64 + 1;
    pos += 2;
    if (control == 0xff) {
      core.clear();
      continue;
    }
    size_t n = std::min(len, size - pos);
    auto& id = ids[control % 3];
    auto r = core.feed(id, {reinterpret_cast<const char*>(data + pos), n});
    pos += n;
    for (auto& s : r.sends) {
      // Replies go only to live connections, and never empty.
      bool live = s.conn == ids[0] || s.conn == ids[1] || s.conn == ids[2];
      if (!live || s.bytes.empty())
        __builtin_trap();
    }
    if (r.close) {
      if (r.problem.empty())
        __builtin_trap(); // every close says why
      core.disconnect(id);
      id = next++;
      core.connect(id);
    }
    if (core.connection_count() != 3 || core.waiting_count() > 3)
      __builtin_trap();
  }
  return 0;
}
