// The job actor and its ranks' Gloo rendezvous (elastic jobs): which process began it
// (its first PUT /global/rank_<r>) and which finished it (Horovod's DELETE /global/<r>),
// the start deadline of a fresh process that never begins it, and what a broken
// generation costs the processes still inside it.
//
// Why it matters (Horovod 0.28.1): hvd.init()'s Gloo rendezvous runs on Horovod's
// background thread outside any try (horovod/common/operations.cc, BackgroundThreadLoop
// -> GlooContext::Initialize), so a rank whose peer never comes, or goes, ends with
// std::terminate when HTTPStore::wait times out (horovod/common/gloo/http_store.cc) or a
// pair closes. Such an end says nothing about its host. And a process that never
// finished a rendezvous has never trained or received the state (TorchState is synced
// only after hvd.init()), so it holds none: it may be restarted at no cost.
//
// Only jobs whose ranks speak Gloo through the server (a rank began a rendezvous) are
// held to these rules: other programs (torch's env://, scripts that only vote) never
// write /global/rank_<r>. Executors are not (their ranks rendezvous inside calls). A
// program that speaks Gloo through the server must finish each rendezvous as Horovod's
// does (DELETE /<scope>/<rank>): a process that never does is taken to hold no state.
#include "actors/job/job_actor.hpp"

namespace cafhvd::driver_impl {

void job::on_reached(uint64_t g, const std::string& key, bool cross, bool connected) {
  uses_cross_ = uses_cross_ || cross;
  auto* s = current(key);
  if (s && s->running && s->launching && g >= s->joined) {
    s->reached = true;
    if (connected) {
      auto& done = cross ? s->cross_gen : s->global_gen;
      done = std::max(done, g);
      (cross ? cross_done_ : global_done_) = true;
    }
    log("rank {} ({}) {} the Gloo rendezvous of scope {} of generation {}", s->rank, key,
        connected ? "finished" : "began", cross ? "cross" : "global", g);
    events_.emit("rank.rendezvous", {{"slot", key},
                                     {"rank", s->rank},
                                     {"generation", g},
                                     {"scope", cross ? "cross" : "global"},
                                     {"connected", connected}});
  }
  // A draining node kept as the state's carrier is left once a rank elsewhere holds it.
  if (connected && !carrier_kept_.empty() && !done_ && !finishing_)
    reconsider();
  // A static executor's ranks rendezvous only inside a call, each call anew: the rules
  // below are for processes that are the training (an elastic executor's are: each runs
  // the worker function once and ends with it; a static executor's may outlive many).
  if (speaks_gloo_ || calls_only())
    return;
  speaks_gloo_ = true;
  // Processes that were past their start deadline before any rank spoke Gloo: now that
  // their peers wait for them, they are late.
  for (auto id : std::exchange(overdue_, {}))
    rendezvous_overdue(id);
}

// A fresh process of an elastic job must begin its Gloo rendezvous within
// --start-timeout of its start (an elastic executor's too: its worker function is its
// training).
void job::arm_rendezvous_deadline(const eslot& s) {
  if (!elastic_)
    return;
  delayed_send(this, job_.start_timeout, deadline_atom::value, dl_rendezvous | (s.id << 4));
}

void job::rendezvous_overdue(uint32_t id) {
  auto* s = slot_by_id(id);
  if (!s || !s->running || s->retired || s->reached || !is_current(*s) || done_ || finishing_)
    return;
  if (!speaks_gloo_) {
    overdue_.insert(id); // nobody waits for it yet (the program may not use Gloo at all)
    return;
  }
  fail_unreached(*s);
}

// The process runs but never began its rendezvous: its peers wait for it in vain, so it
// fails as its host's fault (blacklisted), and the generation breaks.
void job::fail_unreached(eslot& s) {
  auto& h = hosts_.at(s.endpoint);
  auto what = fmt::format("rank {} on host {} did not reach the job's rendezvous within {} s of "
                          "its start (--start-timeout): its process runs but never began the "
                          "Gloo rendezvous of hvd.init(); stopping it",
                          s.rank, h.info.name, job_.start_timeout.count() / 1000.0);
  if (s.warm_for != 0 && only_newcomers_on(s.endpoint))
    return newcomer_failed(s, what);
  note_failure(what);
  say("{}", what);
  if (finishing_ || done_)
    return;
  reset_reason_ = "after a failure";
  blacklist(s.endpoint); // stops its processes
  break_generation(s.endpoint);
  abort_gloo();
  reconsider();
  maybe_finish();
}

// A failure broke the released generation (called after the failed host's processes
// were retired). Its other processes that never finished a Gloo rendezvous hold no state and cannot
// finish this one (a peer is gone): they are killed now, without blame, and their slots start
// afresh in the next plan. Left alone, such a process would be carried into the next plan as if it
// held state, and would rendezvous with the broken plan's ranks and sizes from its environment.
void job::break_generation(const std::string& failed_ep) {
  if (!elastic_ || released_gen_ == 0)
    return;
  broken_gen_ = released_gen_;
  if (!speaks_gloo_)
    return;
  // The failed host's local ranks in the broken plan: their cross_<k> scopes cannot
  // finish either.
  std::set<int> failed_local;
  auto fit = hosts_.find(failed_ep);
  for (auto& row : released_plan_)
    if (fit != hosts_.end() && row.hostname == fit->second.info.name)
      failed_local.insert(row.local_rank);
  auto own_local = [&](const eslot& s) {
    for (auto& row : released_plan_)
      if (slot_key(row.hostname, row.local_rank) == s.key)
        return row.local_rank;
    return -1;
  };
  for (auto& [id, s] : slots_) {
    if (!s.running || s.retired || !s.launching || !is_current(s))
      continue;
    auto host = hosts_.at(s.endpoint).info.name;
    if (initialized_gen(s) == 0) {
      say("rank {} on host {} had not finished its first rendezvous when generation {} broke: "
          "it holds no state; restarting its slot",
          s.rank, host, released_gen_);
      events_.emit("rank.restarted",
                   {{"slot", s.key}, {"rank", s.rank}, {"generation", released_gen_}});
    } else if (s.rendezvous_gen == released_gen_ && initialized_gen(s) < released_gen_
               && (s.global_gen < released_gen_ || failed_local.count(own_local(s)))) {
      // It holds state but is inside the broken plan's hvd.init() in a scope the failed
      // host's ranks share (global: every rank; cross_<k>: the same local rank): it
      // cannot finish it, and Horovod would end it with std::terminate only at
      // HOROVOD_GLOO_TIMEOUT_SECONDS (a soak saw such ranks neither end nor re-join for
      // 30 s). Its state is lost either way; stopped now, the job goes on (or says that
      // the state is gone) at once.
      say("rank {} on host {} was inside generation {}'s rendezvous, which cannot finish "
          "now (Horovod would end it at HOROVOD_GLOO_TIMEOUT_SECONDS): stopping it; the "
          "state it held is lost with it",
          s.rank, host, released_gen_);
      events_.emit("rank.doomed",
                   {{"slot", s.key}, {"rank", s.rank}, {"generation", released_gen_}});
    } else {
      continue;
    }
    s.retired = true;
    send(coord_, leave_atom::value, s.key);
    if (s.worker)
      send(s.worker, terminate_atom::value, int32_t{SIGKILL});
  }
}

// A process aborted (std::terminate: SIGABRT) inside a rendezvous it could not finish is
// not at fault when its generation had already broken, or when a peer of its plan never
// began the rendezvous: Horovod ends it that way on a lost peer or a store timeout. Its
// host is not blacklisted; a peer that never came is failed now (it is the cause). With
// neither seen yet, the verdict waits a moment: the failure that broke the rendezvous (a
// peer's end, a lost agent) may be reported after the abort it caused.
bool job::collateral_exit(eslot& s, const std::string& how, int signal, const std::string& why) {
  if (!elastic_ || !speaks_gloo_ || signal != SIGABRT || released_gen_ == 0
      || s.joined != released_gen_ || s.rendezvous_gen != released_gen_
      || initialized_gen(s) >= s.rendezvous_gen)
    return false;
  s.running = false;
  if (broken_gen_ == released_gen_) {
    spare(s, how,
          fmt::format("generation {} had already broken ({})", released_gen_,
                      last_failure_.value_or("a failure")));
    return true;
  }
  for (auto& [id, p] : slots_)
    if (&p != &s && p.running && !p.retired && p.launched && !p.reached && is_current(p)
        && p.joined == released_gen_) {
      auto cause = fmt::format("rank {} ({}) of its plan had not begun it", p.rank, p.key);
      fail_unreached(p); // the cause
      spare(s, how, cause);
      return true;
    }
  s.verdict = std::make_pair(how, why);
  log("rank {} ({}) aborted inside the rendezvous of generation {}: judged in 1 s", s.rank, s.key,
      released_gen_);
  delayed_send(this, std::chrono::seconds(1), deadline_atom::value, dl_verdict | (s.id << 4));
  return true;
}

// The moment after an abort inside a rendezvous: collateral if its generation broke
// meanwhile, else its own failure.
void job::judge_abort(uint32_t id) {
  auto* s = slot_by_id(id);
  if (!s || !s->verdict)
    return;
  auto [how, why] = *std::exchange(s->verdict, std::nullopt);
  if (done_ || finishing_)
    return maybe_finish();
  if (broken_gen_ == s->joined)
    return spare(
        *s, how,
        fmt::format("generation {} broke ({})", s->joined, last_failure_.value_or("a failure")));
  slot_failed(*s, why);
}

// A process that ended without fault of its own: said, recorded, nobody blacklisted.
void job::spare(eslot& s, const std::string& how, const std::string& cause) {
  auto host = hosts_.at(s.endpoint).info.name;
  say("rank {} on host {} {} inside the rendezvous of generation {}, which it could not "
      "finish: {}; its host is not blamed",
      s.rank, host, how, s.joined, cause);
  events_.emit("rank.collateral", {{"slot", s.key},
                                   {"rank", s.rank},
                                   {"generation", s.joined},
                                   {"how", how},
                                   {"cause", cause}});
  if (!done_ && !finishing_) {
    reset_reason_ = "after a failure";
    reconsider();
  }
  maybe_finish();
}

// The last generation whose hvd.init() the process finished: its rendezvous of scope
// cross_<k>, the last of Horovod's three (of global for a program that never uses cross_
// scopes, as caf-hvd-allreduce), 0 if none.
uint64_t job::initialized_gen(const eslot& s) const {
  return uses_cross_ ? s.cross_gen : s.global_gen;
}

// Whether a rank ever finished hvd.init(): training state may exist.
bool job::state_made() const {
  return uses_cross_ ? cross_done_ : global_done_;
}

// Whether the process may hold training state: in a job whose ranks speak Gloo, only
// once it finished hvd.init() (before that it neither trained nor was sent the state).
bool job::holds_state(const eslot& s) const {
  return !speaks_gloo_ || initialized_gen(s) > 0;
}

// -- warm joins -------------------------------------------------------------------------
// A forming plan's fresh slots start their processes when the plan forms, each pointed at
// the plan's lot: a port of the rendezvous server whose requests are held, unread by the
// store, until the release. So a newcomer imports and reaches its first rendezvous while
// the running ranks train on; they are told of the plan (rank 0's notice, /elastic/update)
// only once every newcomer waits there, and the plan is released only then. A newcomer
// that fails before the release costs them nothing: its host is blacklisted and the plan
// forms again without it. Only for jobs whose ranks speak Gloo through the server (others,
// e.g. torch's env://, would talk to the running plan's torch store). An elastic
// executor's newcomer is warm too: its worker function, sent at its start, imports and
// calls hvd.init() there.

bool job::warm_plan() const {
  return elastic_ && ec_.warm_joins && speaks_gloo_ && released_gen_ > 0
         && !gen_.released && !gen_.fresh.empty();
}

void job::open_lot() {
  lot_gen_ = gen_.number;
  lot_port_ = 0;
  auto g = gen_.number;
  request(coord_, std::chrono::seconds(5), lot_atom::value, g)
      .then(
          [this, g](uint16_t port) {
            if (g != gen_.number || gen_.released || done_ || finishing_ || lot_gen_ != g)
              return;
            if (port == 0) {
              lot_gen_ = 0; // cold: the newcomers start at the release
              if (held_notice_) {
                notice_sent_ = true;
                send(coord_, notify_atom::value, g, *std::exchange(held_notice_, std::nullopt));
              }
              return;
            }
            lot_port_ = port;
            log("generation {}: newcomers start now and wait at port {}", g, port);
            std::map<std::string, std::vector<uint32_t>> by_host;
            for (auto id : std::exchange(awaiting_release_, {}))
              if (auto* s = slot_by_id(id);
                  s && s->running && !s->retired && s->worker && !s->launching)
                by_host[s->endpoint].push_back(id);
            for (auto& [ep, ids] : by_host)
              launch_slots(ep, ids);
          },
          [this, g](caf::error& e) {
            if (g == gen_.number && lot_gen_ == g)
              fail(fmt::format("the job's coordinator did not open generation {}'s lot: {}", g,
                               describe(e)));
          });
}

void job::on_parked(uint64_t g, const std::string& key) {
  if (g != gen_.number || gen_.released || done_)
    return;
  auto* s = current(key);
  if (!s || s->warm_for != g || !s->running || s->retired)
    return;
  s->reached = true;
  auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - s->started).count();
  log("rank {} ({}) of generation {} waits at its first rendezvous, {:.0f} ms after its start",
      s->rank, key, g, ms);
  events_.emit("rank.parked", {{"slot", key}, {"rank", s->rank}, {"generation", g}, {"ms", ms}});
  if (!newcomers_ready())
    return;
  events_.emit("generation.ready", {{"generation", g}});
  if (held_notice_) {
    log("generation {}: every newcomer waits at its first rendezvous; telling the running ranks",
        g);
    notice_sent_ = true;
    send(coord_, notify_atom::value, g, *std::exchange(held_notice_, std::nullopt));
  }
  if (held_for_newcomers_ == g) {
    held_for_newcomers_ = 0;
    on_complete(g);
  }
}

// Every fresh slot of the forming plan has its newcomer waiting at the lot (true when
// the plan's newcomers start cold, at the release).
bool job::newcomers_ready() const {
  if (lot_gen_ != gen_.number || gen_.released)
    return true;
  for (auto& key : gen_.fresh) {
    auto it = current_.find(key);
    if (it == current_.end())
      return false;
    auto& s = slots_.at(it->second);
    if (s.warm_for != gen_.number || !s.reached || !s.running || s.retired)
      return false;
  }
  return true;
}

// Stops the newcomers waiting for any plan but `keep` (0: all): they hold nothing, and
// a new plan starts its own.
void job::stop_newcomers(uint64_t keep) {
  for (auto& [id, s] : slots_) {
    if (s.warm_for == 0 || s.warm_for == keep || !s.running || s.retired)
      continue;
    log("rank {} ({}) waited for generation {}, which will not run: stopping it", s.rank, s.key,
        s.warm_for);
    events_.emit("rank.unparked", {{"slot", s.key}, {"generation", s.warm_for}});
    s.retired = true;
    send(coord_, leave_atom::value, s.key);
    if (s.worker)
      send(s.worker, terminate_atom::value, int32_t{SIGKILL});
  }
}

// Whether no process of a released plan runs on the host (only newcomers, if any).
bool job::only_newcomers_on(const std::string& ep) const {
  for (auto& [id, s] : slots_)
    if (s.endpoint == ep && s.running && !s.retired && s.launched && s.warm_for == 0)
      return false;
  return true;
}

// A newcomer failed before its plan's release: its host is blacklisted and the plan
// forms again without it; the running ranks were never told of it and go on.
void job::newcomer_failed(eslot& s, const std::string& what) {
  note_failure(what);
  say("{}; it was not released yet: the running ranks go on", what);
  if (finishing_ || done_)
    return maybe_finish();
  blacklist(s.endpoint);
  reconsider();
  maybe_finish();
}

} // namespace cafhvd::driver_impl
