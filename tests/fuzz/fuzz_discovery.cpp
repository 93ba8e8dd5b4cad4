// Fuzz target: host discovery script output.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/job/host_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto slots = size > 0 && data[0] % 2 ? std::optional<uint32_t>{4} : std::nullopt;
    for (auto& h :
         cafhvd::parse_discovery_output({reinterpret_cast<const char*>(data), size}, slots))
      if (h.host.empty() || h.slots == 0 || h.port == 0)
        __builtin_trap();
  } catch (const cafhvd::spec_error&) {
  }
  return 0;
}
