// Fuzz target: Slurm hostlists and SLURM_TASKS_PER_NODE. Accepted lists give non-empty
// names without brackets, commas or white space, and never more than the cap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runtime/job/allocation.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    auto hosts = cafhvd::expand_hostlist(text);
    if (hosts.empty() || hosts.size() > cafhvd::max_hostlist_hosts)
      std::abort();
    for (auto& h : hosts)
      if (h.empty() || h.find_first_of("[], \t\n") != std::string::npos)
        std::abort();
  } catch (const cafhvd::spec_error&) {
  }
  try {
    auto tasks = cafhvd::expand_tasks_per_node(text);
    if (tasks.empty() || tasks.size() > cafhvd::max_hostlist_hosts)
      std::abort();
    for (auto t : tasks)
      if (t == 0)
        std::abort();
  } catch (const cafhvd::spec_error&) {
  }
  return 0;
}
