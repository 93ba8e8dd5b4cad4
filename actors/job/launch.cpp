// The job actor's processes: workers spawned per host (one request) and registered
// with the coordinator, each rank's environment, launches per host, retirement, and
// how every exit is judged (success, fail fast, or an elastic failure).
#include "actors/job/job_actor.hpp"

namespace cafhvd::driver_impl {

// One host's new slots: one request spawns their workers (the node's colocator does
// it locally), one request launches them. Messages per job grow with hosts, not ranks.
void job::start_slots(const std::string& hostname,
                      const std::vector<std::pair<std::string, slot_info>>& rows) {
  auto* h = host_by_name(hostname);
  if (!h)
    return fail(fmt::format("internal error: host {} of the plan is not ready", hostname));
  std::vector<uint32_t> ids;
  for (auto& [key, row] : rows) {
    eslot s;
    s.id = next_slot_id_++;
    s.key = key;
    s.endpoint = h->endpoint();
    s.running = true;
    s.rank = row.rank;
    s.started = clock_type::now();
    // A retired process of the same slot may still be ending: it keeps its own entry.
    slots_[s.id] = s;
    current_[key] = s.id;
    ids.push_back(s.id);
  }
  auto ep = h->endpoint();
  // Two answers before the launch: the colocator's (the workers) and the coordinator's
  // (each worker reported that it runs on this host).
  struct join {
    std::optional<std::vector<worker_actor>> workers;
    std::optional<std::vector<std::string>> reports;
  };
  auto both = std::make_shared<join>();
  auto ready = [this, ep, ids, both] {
    if (!both->workers || !both->reports)
      return;
    std::vector<uint32_t> go;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto w = i < both->workers->size() ? (*both->workers)[i] : worker_actor{};
      if (!worker_spawned(ids[i], w))
        continue;
      auto& problem = (*both->reports)[i];
      if (!problem.empty()) {
        if (auto* s = slot_by_id(ids[i]); s && s->running)
          slot_failed(*s, "cannot start: " + problem);
        continue;
      }
      go.push_back(ids[i]);
    }
    log("host {}: the workers of {} slot{} are spawned and registered", ep, go.size(),
        go.size() == 1 ? "" : "s");
    launch_slots(ep, go);
    maybe_finish(); // a failure above may have left nothing running
  };
  request(coord_, job_.start_timeout + std::chrono::seconds(1), expect_atom::value, ids,
          h->info.name, h->colocator.node())
      .then(
          [both, ready](std::vector<std::string>& reports) {
            both->reports = std::move(reports);
            ready();
          },
          [this, ids](caf::error& e) {
            fail_running(
                ids, fmt::format("the coordinator did not answer for its worker: {}", describe(e)));
          });
  // A node may hold the request while this job's replaced ranks there end (their
  // SIGTERM, a grace period, SIGKILL): it answers within twice the grace and 3 s.
  auto wait = std::max<std::chrono::milliseconds>(job_.start_timeout,
                                                  2 * job_.kill_grace + std::chrono::seconds(5));
  uint32_t ending = 0; // this job's ranks there that end, holding node slots until gone
  for (auto& [id, s] : slots_)
    if (s.endpoint == ep && s.running && s.retired
        && std::find(ids.begin(), ids.end(), id) == ids.end())
      ++ending;
  request(h->colocator, wait, workers_atom::value, ids, ending)
      .then(
          [both, ready](std::vector<worker_actor>& workers) {
            both->workers = std::move(workers);
            ready();
          },
          [this, ids, ep](caf::error& e) {
            auto why = describe(e);
            // A full node is not a broken node: an elastic job that has nothing running
            // there (ranks it retired are ending) leaves it for now and asks again while
            // it is listed, instead of blacklisting it.
            // One that runs ranks there keeps them and grows there later: the
            // node's slots are other jobs' for now.
            if (elastic_ && why.find(node_full_words) != std::string::npos) {
              bool keeps = runs_on(ep, ids);
              for (auto id : ids)
                if (auto* s = slot_by_id(id); s && s->running) {
                  s->running = false;
                  s->retired = true;
                  send(coord_, leave_atom::value, s->key);
                }
              if (keeps)
                return host_full(ep, ids, why);
              return host_unusable(ep, why);
            }
            fail_running(ids, fmt::format("cannot start its worker: {}", why));
          });
}

// True when a slot of this job other than `except` runs on host `ep` and stays (a
// retired one is ending).
bool job::runs_on(const std::string& ep, const std::vector<uint32_t>& except) const {
  for (auto& [id, s] : slots_)
    if (s.endpoint == ep && s.running && !s.retired
        && std::find(except.begin(), except.end(), id) == except.end())
      return true;
  return false;
}

// An elastic job's new ranks on host `ep`, where it runs others, were refused for lack of
// slots: the host keeps the ranks the job runs there and offers no more until a while has
// passed (then discovery's count is asked for again). Nothing is blacklisted.
void job::host_full(const std::string& ep, const std::vector<uint32_t>& refused,
                    const std::string& why) {
  auto it = hosts_.find(ep);
  if (it == hosts_.end())
    return;
  auto& h = it->second;
  int kept = 0;
  for (auto& [id, s] : slots_)
    if (s.endpoint == ep && s.running && !s.retired
        && std::find(refused.begin(), refused.end(), id) == refused.end())
      ++kept;
  h.full_cap = kept;
  h.full_until =
      clock_type::now() + std::max(ec_.discovery_interval, std::chrono::milliseconds(5000));
  auto text = fmt::format("host {} is full: the job keeps its {} rank{} there and asks for more "
                          "again while it is listed: {}",
                          h.label(), kept, kept == 1 ? "" : "s", why);
  if (text != h.last_warning) {
    say("warning: {}", text);
    events_.emit("host.full", {{"host", ep}, {"kept", kept}, {"cause", why}});
  }
  h.last_warning = text;
  reconsider();
}

// A batch request for these slots failed: each still running fails with `why`.
void job::fail_running(const std::vector<uint32_t>& ids, const std::string& why) {
  for (auto id : ids)
    if (auto* s = slot_by_id(id); s && s->running)
      slot_failed(*s, why);
}

// True when the slot's worker may launch its process now.
bool job::worker_spawned(uint32_t id, worker_actor w) {
  auto* s = slot_by_id(id);
  if (!s)
    return false;
  if (!w) {
    slot_failed(*s, "its node could not spawn its worker");
    return false;
  }
  monitor(w);
  s->worker = w;
  if (s->retired || done_) {
    s->running = false;
    demonitor(w.address()); // its end is ours, not news of its node
    send_exit(w, caf::exit_reason::user_shutdown);
    return false;
  }
  return true;
}

// --torch-store off: MASTER_PORT is a port free on rank 0's host now, found anew for
// every generation (rank 0 and its host may have changed); new processes wait for it.
void job::find_master_port() {
  master_port_ = 0;
  auto g = gen_.number;
  auto host = gen_.plan.front().hostname;
  auto* m = host_by_name(host);
  if (!m)
    return fail(fmt::format("internal error: rank 0's host {} is not ready", host));
  request(m->colocator, job_.start_timeout, port_atom::value)
      .then(
          [this, g, host](int32_t port) {
            if (g != gen_.number || done_)
              return;
            if (port <= 0)
              return fail(fmt::format("rank 0's host {} found no free port for MASTER_PORT", host));
            master_port_ = port;
            std::map<std::string, std::vector<uint32_t>> by_host;
            for (auto id : std::exchange(awaiting_port_, {}))
              if (auto* s = slot_by_id(id); s && s->running && !s->retired && s->worker)
                by_host[s->endpoint].push_back(id);
            for (auto& [ep, ids] : by_host)
              launch_slots(ep, ids);
          },
          [this, g, host](caf::error& e) {
            if (g == gen_.number)
              fail(fmt::format("MASTER_PORT: rank 0's host {} did not answer: {}", host,
                               describe(e)));
          });
}

// The slot's environment from its row of the current plan (which may be newer than
// the one its worker was spawned for); nullopt when it cannot launch now.
std::optional<std::vector<std::string>> job::rank_environment(eslot& s) {
  auto it = gen_.rows.find(s.key);
  if (it == gen_.rows.end()) {
    // The slot left the job while its worker was spawned.
    s.running = false;
    s.retired = true;
    demonitor(s.worker.address());
    send_exit(s.worker, caf::exit_reason::user_shutdown);
    return std::nullopt;
  }
  bool warm = lot_gen_ == gen_.number && !gen_.released;
  if (!gen_.released && !(warm && lot_port_ != 0)) {
    // A process reads its place from its environment: it starts with the released plan
    // and never writes into the rendezvous scopes of a plan it will not run in (warm
    // joins: it starts with the forming plan and waits at the plan's lot, a port whose
    // requests the server holds until the release).
    awaiting_release_.push_back(s.id);
    return std::nullopt;
  }
  auto& row = it->second;
  auto& h = hosts_.at(s.endpoint);
  auto* master_host = host_by_name(gen_.plan.front().hostname);
  if (!master_host) {
    slot_failed(s, "rank 0's host is gone");
    return std::nullopt;
  }
  auto& master = *master_host;
  bool agent_store = served_->store_port != 0;
  if (!agent_store && master_port_ <= 0) {
    awaiting_port_.push_back(s.id); // launched when this generation's port is known
    return std::nullopt;
  }
  rank_env_input in;
  in.rank = row.rank;
  in.size = row.size;
  in.local_rank = row.local_rank;
  in.local_size = row.local_size;
  in.cross_rank = row.cross_rank;
  in.cross_size = row.cross_size;
  in.group_rank = static_cast<int>(std::find_if(plan_hosts_.begin(), plan_hosts_.end(),
                                                [&](auto& x) { return x.hostname == row.hostname; })
                                   - plan_hosts_.begin());
  in.hostname = h.info.name;
  if (agent_store) {
    in.master_addr = served_->address;
    in.master_port = served_->store_port;
    in.agent_store = true;
    in.restart_count = static_cast<int>(gen_.number - 1);
  } else {
    in.master_addr = master.reach_address;
    in.master_port = master_port_;
  }
  in.nccl_ifaces = h.nics;
  in.iface = h.nics.empty() ? std::string{} : h.nics.front();
  in.rendezvous_addr = served_->address;
  in.rendezvous_port = warm ? lot_port_ : served_->port;
  in.base = job_.base_env;
  in.extra = job_.extra_env;
  in.cuda_visible_devices = visible_devices(h, row.local_rank);
  in.cpus_per_slot = static_cast<int>(job_.cpus_per_slot);
  if (elastic_) {
    in.extra.push_back("HOROVOD_ELASTIC=1");
    // the released plan it starts in: /elastic/update says when a newer one forms
    in.extra.push_back(fmt::format("CAF_HVD_GENERATION={}", gen_.number));
  }
  auto env = build_rank_env(in);
  env.push_back("PWD=" + job_.cwd);
  std::sort(env.begin(), env.end());
  return env;
}

// Launches the slots (all of host `ep`, workers spawned) with one message: the
// variables they share once, each slot's own beside them.
void job::launch_slots(const std::string& ep, const std::vector<uint32_t>& ids) {
  auto hit = hosts_.find(ep);
  if (hit == hosts_.end() || !hit->second.colocator)
    return;
  launch_batch batch;
  std::vector<std::vector<std::string>> envs;
  for (auto id : ids) {
    auto* s = slot_by_id(id);
    if (!s || !s->running || s->retired || !s->worker)
      continue;
    auto env = rank_environment(*s);
    if (!env)
      continue;
    batch.slots.push_back(id);
    envs.push_back(std::move(*env));
    s->launching = true;
    s->launch_pending = true;
    if (elastic_ && gen_.released)
      s->joined = s->rendezvous_gen = gen_.number; // it starts in the released plan
    else if (elastic_)
      s->warm_for = gen_.number; // it waits at the forming plan's lot
    if (executor() && !boot_.empty())
      s->calls.push_back(0);
    open_outputs(s->key);
  }
  if (batch.slots.empty())
    return;
  batch.common_env = envs.front();
  for (size_t i = 1; i < envs.size(); ++i) {
    std::vector<std::string> both;
    std::set_intersection(batch.common_env.begin(), batch.common_env.end(), envs[i].begin(),
                          envs[i].end(), std::back_inserter(both));
    batch.common_env.swap(both);
  }
  for (auto& env : envs) {
    std::vector<std::string> own;
    std::set_difference(env.begin(), env.end(), batch.common_env.begin(), batch.common_env.end(),
                        std::back_inserter(own));
    batch.envs.push_back(std::move(own));
  }
  batch.argv = job_.command;
  batch.cwd = job_.cwd;
  if (executor()) {
    batch.executor = true;
    batch.boot = boot_;
    batch.max_frame = job_.max_frame;
  }
  auto launched = batch.slots;
  request(hit->second.colocator, job_.start_timeout, launch_atom::value, std::move(batch))
      .then(
          [this, launched](std::vector<int32_t>& pids) {
            for (size_t i = 0; i < launched.size(); ++i)
              if (i < pids.size() && pids[i] > 0)
                slot_launched(launched[i], pids[i]);
            // pid 0: the process could not start; its worker reports how it ended
            launch_answered(launched);
          },
          [this, launched](caf::error& e) {
            launch_answered(launched);
            fail_running(launched, fmt::format("launch failed: {}", describe(e)));
          });
}

// A rank's exit report comes from its worker, its launch reply through its colocator
// (once every rank of the batch has started): a process that ends at once may be
// reported before it is known to have started. Such a report waits here for the reply,
// so a rank starts before it ends, in the job's log, its events and its phases.
void job::launch_answered(const std::vector<uint32_t>& ids) {
  std::vector<rank_exit> early;
  for (auto id : ids)
    if (auto* s = slot_by_id(id)) {
      s->launch_pending = false;
      if (s->early_exit)
        early.push_back(*std::exchange(s->early_exit, std::nullopt));
    }
  for (auto& ex : early)
    on_exit(ex);
}

void job::slot_launched(uint32_t id, int32_t pid) {
  auto* s = slot_by_id(id);
  if (!s)
    return;
  s->launched = true;
  log("rank {} ({}) started, pid {}", s->rank, s->key, pid);
  arm_rendezvous_deadline(*s);
  if (events_.enabled())
    events_.emit("rank.started", {{"rank", s->rank},
                                  {"host", hosts_.at(s->endpoint).info.name},
                                  {"slot", s->key},
                                  {"pid", pid},
                                  {"generation", gen_.number}});
  // A static job launches each slot of its one generation once.
  if (!elastic_ && !all_started_ && ++launched_ == gen_.plan.size()) {
    all_started_ = true;
    log("all {} ranks started", gen_.plan.size());
    // A rank may have failed while another host's launch reply was on its way: the
    // job is in teardown then, and stays there.
    if (done_)
      return;
    phase("run");
    if (executor())
      send_rank_table();
  }
}

// A slot that will not take part any more: its held votes are answered and its
// process, if it does not end by itself, is stopped after the grace period.
void job::retire_slot(const std::string& key) {
  send(coord_, leave_atom::value, key);
  auto* s = current(key);
  if (!s || s->retired || drop_if_unlaunched(*s))
    return;
  s->retired = true;
  if (!s->running)
    return;
  // A process that holds the job's state (it runs in the released plan) leaves as
  // Horovod's do: told through rank 0's notice, it re-joins at its next commit with the
  // others and is answered -1. Stopped a grace period after the new plan's release, or
  // at the elastic timeout when no release comes, never in the middle of its step.
  // (A rank of a blacklisted or lost host is stopped after the grace period as before.)
  auto& h = hosts_.at(s->endpoint);
  if (elastic_ && !gen_.released && released_gen_ > 0 && s->joined == released_gen_
      && !h.blacklisted && h.st == ehost::status::ready) {
    s->stop_at_release = true;
    delayed_send(this, ec_.elastic_timeout + job_.kill_grace, retire_atom::value, s->id,
                 int32_t{SIGTERM});
    return;
  }
  delayed_send(this, job_.kill_grace, retire_atom::value, s->id, int32_t{SIGTERM});
}

void job::on_exit(const rank_exit& ex) {
  auto* s = slot_by_id(ex.rank);
  if (!s || !s->running)
    return;
  if (s->launch_pending) {
    s->early_exit = ex; // launch_answered plays it
    return;
  }
  s->running = false;
  exit_status st{ex.code, ex.signal, ex.exec_error};
  auto how = describe_exit(st, ex.stopped_by);
  s->exit_code = st.launcher_code();
  // A rank of a host the job removed (gone from discovery, or drained) is no failure
  // whatever its exit: a removed Horovod worker aborts in its re-init.
  auto end = host_end_.find(hosts_.at(s->endpoint).info.name);
  bool host_removed = end != host_end_.end() && end->second == "removed";
  ++process_ends_[s->exit_code == 0 ? std::string{"exit 0"}
                  : host_removed    ? fmt::format("code {} on a removed host", s->exit_code)
                                    : fmt::format("code {}", s->exit_code)];
  log("rank {} on {} ended: {}", s->rank, s->key, how);
  if (executor())
    fail_calls(*s, loss_cause(*s, how));
  if (events_.enabled()) {
    nlohmann::json ended{{"rank", s->rank},
                         {"host", hosts_.at(s->endpoint).info.name},
                         {"slot", s->key},
                         {"code", st.launcher_code()},
                         {"signal", st.signal},
                         {"generation", gen_.number},
                         {"retired", s->retired || !is_current(*s) || !in_plan(s->key)},
                         {"host_removed", host_removed}};
    if (!st.exec_error.empty())
      ended["exec_error"] = st.exec_error;
    if (!ex.stopped_by.empty())
      ended["stopped_by"] = ex.stopped_by;
    events_.emit("rank.ended", ended);
  }
  if (!is_current(*s)) {
    slots_.erase(ex.rank); // a replaced process: nothing refers to it any more
    return maybe_finish();
  }
  send(coord_, gone_atom::value, s->key); // its notification service ended with it
  if (s->retired || !in_plan(s->key)) {
    send(coord_, leave_atom::value, s->key);
    return maybe_finish();
  }
  // A static executor's ranks end when the owner shuts them down, not before.
  bool early_end = executor() && !elastic_ && !shutdown_requested_;
  if (st.launcher_code() == 0 && !early_end) {
    if (!finishing_) {
      finishing_ = true;
      log("rank {} finished; the job ends when the others do", s->rank);
      // Ranks that wait for another generation are told that there is none.
      send(coord_, stop_atom::value);
      // Fresh slots of a plan that will not be released are dropped; a released
      // generation's ranks that did not launch yet (a short rank 0 may end before its
      // peers on another host start) still run, and the job ends when they do.
      drop_unlaunched(/*keep_released=*/true);
      stop_newcomers(0); // ... and newcomers waiting for it
    }
    return maybe_finish();
  }
  auto why = fmt::format("{} {}", st.exec_error.empty() ? "ended with" : "could not start:", how);
  if (!s->channel_problem.empty())
    why = how = fmt::format("broke its executor channel: {} (killed)", s->channel_problem);
  else if (early_end && st.launcher_code() == 0)
    why = how = "ended (exit code 0) while the executor still needed it";
  if (!elastic_)
    return failed_fast(*s, why, how, std::max(st.launcher_code(), 1));
  if (collateral_exit(*s, how, st.signal, why))
    return;
  if (!ex.stopped_by.empty()) {
    // Its node agent stopped it as it shut down (a restart, an upgrade without a drain):
    // the node leaves, as a drained one does, and is taken again once it is listed again;
    // its host is not to blame.
    auto& h = hosts_.at(s->endpoint);
    say("rank {} on host {} {}: the job leaves the node until it is listed again", s->rank,
        h.info.name, why);
    h.listed = false;
    s->running = false;
    reset_reason_ = "a node agent shut down";
    break_generation(s->endpoint);
    abort_gloo();
    reconsider();
    return maybe_finish();
  }
  slot_failed(*s, why);
}

// Static jobs: the first rank that fails stops the job, which exits with its code.
void job::failed_fast(eslot& s, const std::string& why, const std::string& how, int code) {
  auto host = hosts_.at(s.endpoint).info.name;
  note_failure(fmt::format("rank {} on host {} {}", s.rank, host, why));
  if (!failure_ && !done_ && !interrupted_) {
    failure_ = fmt::format("rank {} on host {} failed first: {}", s.rank, host, how);
    failure_code_ = code;
    say("rank {} on host {} {}{}", s.rank, host, why,
        gen_.plan.size() > 1 ? "; stopping the other ranks" : "");
    teardown();
  }
  maybe_finish();
}

void job::slot_failed(eslot& s, const std::string& why) {
  s.running = false;
  auto& h = hosts_.at(s.endpoint);
  auto what = fmt::format("rank {} on host {} {}", s.rank, h.info.name, why);
  if (!elastic_)
    return fail(what); // a worker that could not be started or launched
  if ((s.warm_for != 0 || (!s.launched && !gen_.released)) && only_newcomers_on(s.endpoint))
    return newcomer_failed(s, what);
  note_failure(what);
  if (finishing_ || done_) {
    if (!failure_)
      failure_ = what;
    return maybe_finish();
  }
  say("{}", what);
  reset_reason_ = "after a failure";
  blacklist(s.endpoint);
  break_generation(s.endpoint);
  abort_gloo();
  reconsider();
  maybe_finish();
}

// -- ending a broken generation's Gloo connections ---------------------------------
// Horovod 0.28 does not close a failed rank's Gloo sockets (process set 0's contexts
// leak on shutdown), so a survivor blocked in a receive from a peer that already
// failed waits for Gloo's timeout (30 s) before it restores its commit and re-joins.
// The survivors' agents shut those connections down at once (runtime/network/socket_abort.hpp);
// the next generation is held until every agent answered (at most 3 s), so no
// connection of the new generation can be hit.
void job::abort_gloo() {
  if (!elastic_ || !served_ || done_ || finishing_)
    return;
  ++aborts_in_flight_; // the coordinator's answer holds the release too
  request(coord_, std::chrono::seconds(3), gloo_atom::value)
      .then([this](gloo_links& links) { send_aborts(links); },
            [this](caf::error& e) {
              log("no Gloo endpoints from the coordinator: {}", describe(e));
              abort_answered();
            });
}

void job::send_aborts(const gloo_links& links) {
  if (links.gloo.empty() || done_)
    return abort_answered(); // no Gloo rendezvous in this generation
  std::map<std::string, std::vector<uint32_t>> by_host;
  for (auto& [id, s] : slots_)
    if (s.running && s.launched && !s.retired && is_current(s))
      by_host[s.endpoint].push_back(id);
  for (auto& [ep, ids] : by_host) {
    auto& h = hosts_.at(ep);
    if (!h.colocator || h.st == ehost::status::lost)
      continue;
    ++aborts_in_flight_;
    auto t0 = clock_type::now();
    request(h.colocator, std::chrono::seconds(3), abort_atom::value, ids, links.gloo, links.keep)
        .then([this, ep, t0](gloo_abort_report& r) { gloo_aborted(ep, t0, r, {}); },
              [this, ep, t0](caf::error& e) {
                gloo_aborted(ep, t0, {}, "no answer: " + describe(e));
              });
  }
  abort_answered(); // the coordinator's part
}

void job::gloo_aborted(const std::string& ep, clock_type::time_point t0, const gloo_abort_report& r,
                       const std::string& error) {
  auto host = hosts_.at(ep).info.name;
  auto problem = error.empty() ? fmt::format("{}", fmt::join(r.problems, "; ")) : error;
  auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  log("host {}: shut down {} Gloo connection{} of {} rank process group{} in {:.0f} ms{}", host,
      r.cut, r.cut == 1 ? "" : "s", r.processes, r.processes == 1 ? "" : "s", ms,
      problem.empty() ? "" : " (" + problem + ")");
  events_.emit("gloo.abort",
               {{"host", host},
                {"processes", r.processes},
                {"cut", r.cut},
                {"ms", ms},
                {"problem", problem.empty() ? nlohmann::json() : nlohmann::json(problem)}});
  if (r.refused && !gloo_abort_refused_) {
    gloo_abort_refused_ = true;
    say("warning: host {} cannot end the failed generation's Gloo connections ({}: needs "
        "pidfd_getfd, Linux 5.6, and ptrace rights over the ranks, e.g. Yama ptrace_scope "
        "0 or 1); survivors that wait on a failed peer recover only at Gloo's timeout "
        "(HOROVOD_GLOO_TIMEOUT_SECONDS)",
        host, problem);
  }
  abort_answered();
}

// One abort request answered: with none left, a generation that completed meanwhile is
// released.
void job::abort_answered() {
  if (--aborts_in_flight_ > 0 || held_complete_ == 0)
    return;
  on_complete(std::exchange(held_complete_, 0));
}

void job::note_failure(const std::string& what) {
  events_.emit("failure", {{"cause", what}});
  if (!first_failure_)
    first_failure_ = what;
  last_failure_ = what;
}

} // namespace cafhvd::driver_impl
