// Fuzz target: hostfiles.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "runtime/job/host_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string{reinterpret_cast<const char*>(data), size}};
  try {
    for (auto& h : cafhvd::parse_hostfile(in, "fuzz"))
      if (h.host.empty() || h.slots == 0 || h.port == 0)
        __builtin_trap();
  } catch (const cafhvd::spec_error&) {
  }
  return 0;
}
