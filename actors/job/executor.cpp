// The job actor's executor relay: the owner's channel (start, calls, shutdown), calls
// relayed to the ranks' workers, their results and logs back, the rank table and the end.
#include "actors/job/job_actor.hpp"
#include "actors/senders.hpp"
#include "runtime/observe/text.hpp"

#include <map>

namespace cafhvd::driver_impl {

bool job::executor() const {
  return job_.executor_fd >= 0;
}

// A static executor: its ranks run calls, each may rendezvous anew inside one.
bool job::calls_only() const {
  return executor() && !elastic_;
}

void job::open_control() {
  auto hdl = caf::actor_cast<driver_full_actor>(this);
  control_ = std::make_unique<frame_channel>(
      job_.executor_fd, job_.max_frame,
      [hdl](frame&& f) {
        post_from(hdl, control_atom::value, static_cast<uint8_t>(f.kind), f.id, f.rank,
                       f.deadline_ms, std::move(f.payload));
      },
      [hdl](const std::string& problem) { post_from(hdl, chanend_atom::value, problem); });
  delayed_send(this, job_.start_timeout, deadline_atom::value, uint32_t{dl_owner});
}

void job::to_owner(frame_kind kind, uint64_t id, uint32_t rank, std::string payload,
                   std::function<void()> done) {
  if (!control_) {
    if (done)
      done();
    return;
  }
  frame f;
  f.kind = kind;
  f.id = id;
  f.rank = rank;
  f.payload = std::move(payload);
  control_->send(std::move(f), std::move(done));
}

void job::owner_broke(const std::string& what) {
  fail(fmt::format("the executor's owner {}", what));
}

void job::on_control(uint8_t kind, uint64_t id, uint32_t rank, uint32_t deadline,
                     std::string payload) {
  switch (static_cast<frame_kind>(kind)) {
  case frame_kind::start:
    if (owner_started_)
      return owner_broke("sent a second start frame");
    owner_started_ = true;
    boot_ = std::move(payload);
    log("the executor's owner started the job (boot call: {} bytes)", boot_.size());
    return begin();
  case frame_kind::call:
    return on_call(id, rank, deadline, std::move(payload));
  case frame_kind::shutdown:
    return on_shutdown();
  case frame_kind::kill_host:
    return on_kill_host(payload);
  default:
    return owner_broke(fmt::format("sent a {} frame (the owner may send start, call, "
                                   "shutdown and kill_host)",
                                   frame_kind_name(kind)));
  }
}

// The slot that has rank `r` in the current plan.
eslot* job::slot_of_rank(uint32_t r) {
  if (r >= gen_.plan.size())
    return nullptr;
  return current(slot_key(gen_.plan[r].hostname, gen_.plan[r].local_rank));
}

void job::on_call(uint64_t id, uint32_t rank, uint32_t deadline, std::string payload) {
  if (id <= last_call_) {
    return owner_broke(
        fmt::format("sent call {} after call {} (call ids must increase)", id, last_call_));
  }
  last_call_ = id;
  auto refuse = [&](uint32_t r, const std::string& why) {
    to_owner(frame_kind::failed, id, r, why);
  };
  if (elastic_)
    return refuse(rank, "an elastic executor runs only its start function; calls are for "
                        "static executors");
  if (done_ || shutdown_requested_)
    return refuse(rank, failure_ ? fmt::format("the worker group failed: {}", *failure_)
                                 : std::string{"the worker group is shutting down"});
  if (!all_started_)
    return refuse(rank, "the ranks are not all started yet (wait for the rank table)");
  if (rank != all_ranks && rank >= gen_.plan.size())
    return refuse(rank,
                  fmt::format("there is no rank {}: the job has {} ranks", rank, gen_.plan.size()));
  uint32_t first = rank == all_ranks ? 0 : rank;
  uint32_t last = rank == all_ranks ? static_cast<uint32_t>(gen_.plan.size()) : rank + 1;
  // One message per host: its colocator hands the call to the workers there.
  std::map<std::string, std::vector<uint32_t>> by_host;
  for (uint32_t r = first; r < last; ++r) {
    auto* s = slot_of_rank(r);
    if (!s || !s->running || !s->worker) {
      refuse(r, fmt::format("rank {} is not running", r));
      continue;
    }
    s->calls.push_back(id);
    by_host[s->endpoint].push_back(s->id);
  }
  size_t left = by_host.size();
  for (auto& [ep, slots] : by_host)
    send(hosts_.at(ep).colocator, call_atom::value, id, deadline,
         --left > 0 ? payload : std::move(payload), std::move(slots));
}

void job::on_result(uint32_t slot, uint64_t id, std::string payload) {
  auto* s = slot_by_id(slot);
  if (!s)
    return;
  // An answer to a call the job already failed (its rank's exit report came first) is
  // dropped: the owner hears of each call once per rank.
  auto it = std::find(s->calls.begin(), s->calls.end(), id);
  if (it == s->calls.end())
    return;
  s->calls.erase(it);
  if (id == 0 && elastic_) {
    // The start function's value: returned when the job ends, for its final ranks.
    s->boot_result = std::move(payload);
    return;
  }
  to_owner(frame_kind::result, id, static_cast<uint32_t>(s->rank), std::move(payload));
}

caf::result<caf::ok_atom> job::on_log(uint32_t slot, std::string payload) {
  auto* s = slot_by_id(slot);
  if (!s || !control_)
    return caf::ok_atom::value;
  auto id = next_log_ack_++;
  auto rp = make_response_promise<caf::ok_atom>();
  log_acks_.emplace(id, rp);
  auto hdl = caf::actor_cast<driver_full_actor>(this);
  // acknowledged once written to the owner: a rank cannot log faster than it reads
  to_owner(frame_kind::log, 0, static_cast<uint32_t>(s->rank), std::move(payload),
           [hdl, id] { post_from(hdl, log_atom::value, id); });
  return rp;
}

// Every call the slot has not answered fails with `cause`.
void job::fail_calls(eslot& s, const std::string& cause) {
  for (auto id : s.calls)
    to_owner(frame_kind::failed, id, static_cast<uint32_t>(s.rank), cause);
  s.calls.clear();
}

// Why a slot's process is gone, for the calls it leaves unanswered.
std::string job::loss_cause(const eslot& s, const std::string& how) {
  auto who = fmt::format("rank {} on host {}", s.rank, hosts_.at(s.endpoint).info.name);
  if (!s.channel_problem.empty())
    return fmt::format("{} broke its executor channel: {} (its process was killed: {})", who,
                       s.channel_problem, how);
  if (done_ && failure_ && !shutdown_requested_)
    return fmt::format("{} was stopped ({}) because the worker group failed: {}", who, how,
                       *failure_);
  return fmt::format("{} died: {}", who, how);
}

void job::send_rank_table() {
  nlohmann::json ranks = nlohmann::json::array();
  for (auto& row : gen_.plan)
    ranks.push_back({{"rank", row.rank},
                     {"host", row.hostname},
                     {"local_rank", row.local_rank},
                     {"local_size", row.local_size},
                     {"cross_rank", row.cross_rank},
                     {"cross_size", row.cross_size}});
  to_owner(frame_kind::ranks, gen_.number, 0,
           json_text(nlohmann::json{
               {"generation", gen_.number}, {"size", gen_.plan.size()}, {"ranks", ranks}}));
}

// The owner kills a host's ranks (an elastic executor's forceful removal of a host, as
// Horovod's TestDiscovery kills a node): they die by SIGKILL, and the job handles their
// exits as any rank's failure (the host is blacklisted, the survivors go on).
void job::on_kill_host(const std::string& name) {
  if (!elastic_)
    return owner_broke("sent kill_host to a static job (only elastic jobs lose hosts)");
  size_t killed = 0;
  for (auto& [id, s] : slots_) {
    auto h = hosts_.find(s.endpoint);
    if (h == hosts_.end() || h->second.info.name != name || !s.running || !s.worker)
      continue;
    send(s.worker, terminate_atom::value, int32_t{SIGKILL});
    ++killed;
  }
  say("the executor's owner removed host {} forcefully: {} of its ranks killed",
      printable(name), killed);
  events_.emit("host.killed", {{"host", name}, {"ranks", killed}});
}

// The owner asks for the end: every rank's channel closes (the process reads EOF and
// exits 0); after the grace period the rest are stopped.
void job::on_shutdown() {
  if (shutdown_requested_)
    return;
  shutdown_requested_ = true;
  log("the executor's owner asked for shutdown");
  if (done_)
    return maybe_finish();
  if (elastic_ || !all_started_) {
    // nothing to hand back: stop what runs
    interrupted_by_owner_ = true;
    teardown();
    return;
  }
  finishing_ = true;
  for (auto& [id, s] : slots_)
    if (s.running && s.worker)
      send(s.worker, close_atom::value);
  delayed_send(this, job_.kill_grace, deadline_atom::value, uint32_t{dl_shutdown});
  maybe_finish();
}

void job::on_owner_gone(const std::string& problem) {
  if (finished_)
    return;
  owner_gone_ = true;
  if (!problem.empty())
    say("the executor's owner broke its channel: {}", problem);
  if (done_)
    return;
  if (shutdown_requested_ && problem.empty())
    return; // shutting down already; nobody waits for the end frame
  failure_ = problem.empty() ? std::string{"the executor's owner closed its channel"}
                             : fmt::format("the executor's owner broke its channel: {}", problem);
  failure_said_ = true;
  say("{}; stopping the job", *failure_);
  teardown();
}

// At the end: nothing stays unanswered, an elastic start function's values come back
// for the final generation's ranks, and the end frame is the last thing written.
void job::end_for_owner(int code) {
  if (!control_)
    return;
  for (auto& [id, s] : slots_)
    fail_calls(s, fmt::format("the job ended before rank {} answered{}", s.rank,
                              failure_ ? ": " + *failure_ : std::string{}));
  if (elastic_ && code == 0 && !boot_.empty()) {
    for (uint32_t r = 0; r < gen_.plan.size(); ++r) {
      auto* s = slot_of_rank(r);
      if (s && s->boot_result)
        to_owner(frame_kind::result, 0, r, std::move(*s->boot_result));
      else
        to_owner(frame_kind::failed, 0, r,
                 fmt::format("rank {} of the final generation returned no value", r));
    }
  }
  to_owner(frame_kind::end, static_cast<uint64_t>(code), 0, failure_ ? *failure_ : std::string{});
  control_->close_after_writes();
  if (!owner_gone_ && !control_->flush(std::chrono::seconds(10)))
    say("warning: the executor's owner did not read the job's end within 10 s");
}

} // namespace cafhvd::driver_impl
