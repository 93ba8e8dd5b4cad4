// Fuzz target: -H host lists.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/job/host_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto hosts = cafhvd::parse_host_list({reinterpret_cast<const char*>(data), size});
    for (auto& h : hosts)
      if (h.host.empty() || h.slots == 0 || h.port == 0)
        __builtin_trap(); // a parser that accepts must return valid specs
  } catch (const cafhvd::spec_error&) {
  }
  return 0;
}
