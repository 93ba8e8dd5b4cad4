// A job's generation as a value: its plan, the slots that voted, the slots that start
// fresh at its release, whether it was released, and when each slot must have joined. The rules
// that decide whether a job may go on live here as pure functions, so that they are tested without
// actors.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/job/assignment.hpp"

namespace cafhvd {

using job_clock = std::chrono::steady_clock;

struct generation {
  uint64_t number = 0;                   // 1, 2, ...; 0: none yet
  std::vector<slot_info> plan;           // in rank order
  std::map<std::string, slot_info> rows; // by slot key (host:local_rank)
  std::set<std::string> votes;           // slots waiting in the rank_and_size barrier
  // Slots without a running process: they get one when the generation is released, with
  // the released plan in its environment, and never vote (a real Horovod worker's first
  // hvd.init() reads its environment and never asks rank_and_size).
  std::set<std::string> fresh;
  bool released = false; // every slot voted and was answered
  job_clock::time_point began{};
  std::optional<job_clock::time_point> first_vote;

  generation() = default;
  generation(uint64_t n, std::vector<slot_info> p, job_clock::time_point now);

  bool has(const std::string& key) const { return rows.count(key) > 0; }
  /// Every slot of the plan that carries a process over (not fresh) voted.
  bool complete() const;
  /// Slots of the plan that carry a process over and have not voted, in rank order.
  std::vector<std::string> missing() const;
  /// Host names of the plan, in rank order, each once.
  std::vector<std::string> hosts() const;
  /// One line: "generation 2 (released): 3 ranks, votes 2/2, 1 fresh, hosts a,b".
  std::string describe() const;
};

/// Host names of a plan, in rank order, each once.
std::vector<std::string> plan_host_names(const std::vector<slot_info>& plan);

/// What the lifecycle knows of one slot's process when it decides deadlines.
struct slot_process {
  std::string key;
  std::string host;
  job_clock::time_point started{};
  uint64_t joined = 0;  // the last released generation it was answered for (0: none)
  bool running = false; // its process runs and its agent is reachable
  // It may hold training state. False for a process of a Gloo-speaking job that never
  // finished a rendezvous: it neither trained nor was sent the state.
  bool holds_state = true;
  // Its last sign of life its worker told of once it had missed a deadline (CPU time or
  // output): a rank still in a long step is waited for from there
  job_clock::time_point alive{};
};

enum class deadline_kind {
  none,     // not bounded yet: nobody of generation 1 waits in the barrier
  fresh,    // a process that never joined: --start-timeout
  carrying, // a process of a released generation, maybe in a long step: --elastic-timeout
};

struct join_deadline {
  deadline_kind kind = deadline_kind::none;
  job_clock::time_point at{};
};

/// When `p` must have voted in `g`. A process that holds training state (it joined a
/// released generation) is waited for up to the elastic timeout from the generation's
/// start or from its last sign of life (`p.alive`), whichever is later; a fresh one has the start timeout from its start or the generation's start
/// (whichever is later) -- in generation 1 only once some slot waits in the barrier, so
/// programs that never vote run unbarriered.
join_deadline deadline_for(const generation& g, const slot_process& p,
                           std::chrono::milliseconds start_timeout,
                           std::chrono::milliseconds elastic_timeout);

/// The slots of the last released generation (number `released`) that still carry its
/// state into a new plan: running, joined it, holding state, and on a host in `available`. Empty
/// with released == 0 means nothing was ever released (no state to lose).
std::vector<std::string> state_carriers(uint64_t released, const std::vector<slot_process>& slots,
                                        const std::set<std::string>& available);

} // namespace cafhvd
