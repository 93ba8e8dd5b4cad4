// What the cluster's table (actors/cluster.cpp) and the joiner (actors/joiner.cpp) share:
// the clock and tokens they use, the agent's own lines, its drain mark, a cancel's ticket.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "actors/config.hpp"
#include "runtime/cluster/credential_files.hpp"

namespace cafhvd::cluster_common {

int64_t unix_ms();
long unix_s();

/// A random 64-bit value, never 0: the tokens that tell an actor's own messages (its
/// timers, a member's news) from what any connected peer could send it by guessing its
/// actor id.
uint64_t random_token();

/// How often a joined agent looks for news to report, and the table for holds that ran out.
constexpr auto report_tick = std::chrono::milliseconds(250);

/// A line of the agent's own on stderr: "caf-hvd node 'NAME': LINE".
void say(const node_settings& n, const std::string& line);

/// This node drains (or is back): it takes no new jobs, every job with ranks here is told
/// (elastic jobs leave it; a static job's ranks run on), and the drain is kept in the
/// agent's state directory, so that the agent comes back drained after a restart (a
/// rolling upgrade's step) until an undrain. `how` replaces the administrator's name in
/// what the jobs are told.
void set_draining(const node_settings& n, bool on, const std::string& admin,
                  const std::string& how = {});

/// Who cancels a job: an administrator (any owner's job of that id), or a driver
/// certificate (only the job of that id that it owns: colocators of another owner's job
/// of the same id ignore it).
struct canceller {
  std::string by;   // as the job's driver says it: "'alice' (its owner)"
  std::string only; // the owner whose job it is ("": any, an administrator or --insecure)
};

/// A cancel's ticket as a node or the table checks it, for the table at `audience`: an
/// administrator's ticket, or a driver's for its own job. Throws saying why not.
canceller check_cancel(const node_settings& n, const signed_ticket& ticket,
                       const std::string& audience, const std::string& job);

} // namespace cafhvd::cluster_common
