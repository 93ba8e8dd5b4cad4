// The node side of a job: the colocator (one per node per job) and the workers (one
// per rank). Node agents offer both for remote spawn; `caf-hvd run` spawns them locally.
#pragma once

#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <algorithm>
#include <deque>
#include <mutex>

#include "actors/config.hpp"
#include "actors/protocol.hpp"
#include "runtime/launch/channel.hpp"
#include "runtime/cluster/gpu.hpp"
#include "runtime/network/nic_probe.hpp"
#include "runtime/launch/process.hpp"

namespace cafhvd {

struct colocator_state {
  colocator_state() = default; // not an aggregate: CAF would construct it from `self`
  ~colocator_state() {
    if (gpu_pool_held)
      gpu_pool_held->release(gpu_owner); // the job's devices come back with its colocator
    if (book)
      book->close(book_id); // every slot it held comes back
  }
  driver_actor driver;
  coordinator_actor coordinator;     // the job's: each worker reports its host there
  std::vector<worker_actor> workers; // live workers of this node
  bool driver_gone = false;
  bool stopping = false;                      // the agent shuts down
  std::unique_ptr<probe_responder> responder; // answers other nodes' NIC probes
  std::map<uint64_t, caf::typed_response_promise<std::vector<probe_result>>> probes;
  uint64_t next_probe = 1;
  std::map<uint32_t, worker_actor> by_slot; // workers it spawned, by slot id
  std::map<uint32_t, int32_t> pids;         // their processes (caf-hvd-exec, a group leader)
  std::set<uint32_t> launching;             // slots whose launch was sent, not answered yet
  std::map<uint64_t, caf::typed_response_promise<gloo_abort_report>> aborts;
  uint64_t next_abort = 1;
  std::shared_ptr<gpu_pool> gpu_pool_held; // set once devices are lent to this job
  uint64_t gpu_owner = 0;
  std::string refused; // the driver's ticket did not check out: it gets only this answer
  // The node's slots this job's workers hold (node_book: --slots is node-wide), and
  // where this job shows in the agent's reports.
  std::shared_ptr<node_book> book;
  uint64_t book_id = 0;
  std::map<uint32_t, uint32_t> node_slot; // slot id -> the node-wide index its worker holds
  // Workers requests that wait for this job's own ending workers to give their node slots
  // back (a rank replaced on this node), by id; each has a deadline.
  struct handover {
    std::vector<uint32_t> slots;
    caf::typed_response_promise<std::vector<worker_actor>> rp;
    std::chrono::steady_clock::time_point since;
  };
  std::map<uint64_t, handover> handovers;
  uint64_t next_handover = 1;
  // The account this job's ranks run as here (nullptr: the agent's own)
  std::shared_ptr<const rank_identity> account;
  static inline const char* name = "colocator";
};

/// Spawn arguments: the job's driver and coordinator, the job id (for diagnostics), the
/// grace period between SIGTERM and SIGKILL when the driver disappears, and the driver's
/// ticket (purpose "colocator", audience this agent's node id, subject the job id): an
/// agent with cluster credentials runs nothing for a spawn without a valid one (CAF lets
/// any connected peer spawn, node agents that join included).
colocator_actor::behavior_type colocator_fn(colocator_actor::stateful_pointer<colocator_state> self,
                                            driver_actor driver, coordinator_actor coordinator,
                                            std::string job, int32_t grace_ms,
                                            signed_ticket ticket);

/// A rank's outstanding calls, shared by its worker and its channel's reader thread.
/// The reader checks each answer against the oldest call and sends it straight to the
/// job, one actor hop less per call, unless a frame of the rank it handed to the worker
/// (a log record, an answer) is still on its way: then the answer follows it through
/// the worker, so the job sees the rank's frames in the order the rank wrote them.
struct call_book {
  std::mutex m;
  std::deque<uint64_t> calls; // not answered yet, oldest first (a rank answers in order)
  int via_worker = 0;         // frames handed to the worker and not yet sent on
  bool closed = false;        // the channel broke: nothing more goes to the job
  bool outstanding(uint64_t id) {
    std::lock_guard g{m};
    return std::find(calls.begin(), calls.end(), id) != calls.end();
  }
  size_t size() {
    std::lock_guard g{m};
    return calls.size();
  }
};

struct worker_state {
  worker_state() = default;
  std::shared_ptr<flow_window> window = std::make_shared<flow_window>(8);
  std::shared_ptr<flow_window> log_window = std::make_shared<flow_window>(8);
  std::unique_ptr<child_process> child; // destroyed before the window: kills the group
  driver_actor driver;
  uint32_t rank = 0;
  std::string stopped_by;   // why the agent stopped this rank, if it did
  int32_t early_signal = 0; // a stop that came before the launch, sent once it is done
  // executor mode: the channel to the process and the calls it has not answered yet
  std::unique_ptr<frame_channel> channel;
  std::shared_ptr<call_book> book = std::make_shared<call_book>();
  bool channel_broken = false; // the job was told why (chanfail); the process is killed
  bool channel_eof = false;    // the process closed its end
  // executor mode: the process exited before its channel reached EOF; its exit goes to
  // the job once every frame it wrote before it (an elastic rank's result) has gone on
  std::optional<exit_status> held_exit;
  std::shared_ptr<const rank_identity> account; // its job's ranks' account (nullptr: the agent's)
  // The rank's last sign of life (its launch, CPU time its process tree used, output),
  // and the CPU time last sampled (each second while it runs)
  std::chrono::steady_clock::time_point alive_at{};
  uint64_t cpu_ticks = 0;
  ~worker_state() {
    window->close();
    log_window->close();
  }
  static inline const char* name = "worker";
};

/// Spawn arguments: the node's colocator, the job's driver and coordinator, and the
/// slot id. The worker reports (slot id, this node's name) to the coordinator at once.
worker_actor::behavior_type worker_fn(worker_actor::stateful_pointer<worker_state> self,
                                      colocator_actor colocator, driver_actor driver,
                                      coordinator_actor coordinator, uint32_t rank,
                                      std::shared_ptr<const rank_identity> account);

/// A worker of this agent, spawned by its colocator (workers are not offered for remote
/// spawn: a peer could otherwise start one bound to no checked driver).
worker_actor spawn_worker(caf::actor_system& sys, colocator_actor colocator, driver_actor driver,
                          coordinator_actor coordinator, uint32_t slot,
                          std::shared_ptr<const rank_identity> account = nullptr);

} // namespace cafhvd
