// The pieces of an elastic job that need no actors: running the host discovery script
// with a deadline, the host order across generations, blacklist cooldowns, and the
// per-generation rank table. The elastic driver actor strings them together.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/job/assignment.hpp"

namespace cafhvd {

/// What one run of the discovery script produced.
struct script_result {
  bool ok = false;
  std::string output; // stdout (at most 4 MiB are kept)
  std::string error;  // why it failed, when !ok (exit status, timeout, stderr's tail)
};

/// Runs `path` (no shell, no arguments, this process's environment) through the rank
/// shim `shim` (caf-hvd-exec: own process group, killed as a whole) and collects its
/// stdout; stderr's last lines are kept for the error message. A script still running
/// after `timeout` is killed and reported as failed. Blocks the calling thread.
script_result run_discovery_script(const std::string& shim, const std::string& path,
                                   std::chrono::milliseconds timeout);

/// Horovod's host order: the previous order without the hosts that are gone, then the
/// new hosts in the order `available` lists them (deterministic, unlike Horovod's set
/// iteration order).
std::vector<std::string> order_hosts(const std::vector<std::string>& previous,
                                     const std::vector<std::string>& available);

/// `--blacklist-cooldown-range LOW HIGH` in seconds.
struct cooldown_range {
  double low = 0;
  double high = 0;
};

/// Cooldown after a host's `failures`-th failure (>= 1): low * 2^failures plus a jitter
/// of `u01` (in [0, 1)) times low, clamped to [low, high].
std::chrono::milliseconds cooldown_delay(const cooldown_range& range, int failures, double u01);

/// What changed between two host sets (Horovod's HostUpdateResult).
enum class host_change : unsigned { none = 0, removed = 1, added = 2, mixed = 3 };
const char* to_string(host_change c);

/// Changes from `before` to `after` (name -> slots, as ordered lists).
host_change compare_hosts(const std::vector<host_slots>& before,
                          const std::vector<host_slots>& after);

} // namespace cafhvd
