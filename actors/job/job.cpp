// The job actor's core: its behaviour (every message it takes), its start, and its end
// (failure, interrupt, teardown with its grace periods, the exit code). The rest of the
// job lives in actors/job_*.cpp by concern; the class is in actors/job/job_actor.hpp.
#include "actors/job/job_actor.hpp"
#include "actors/senders.hpp"

namespace cafhvd::driver_impl {

job::behavior_type job::make_behavior() {
  started_ = clock_type::now();
  job_id_ = job_.job_id.empty() ? make_job_id() : job_.job_id;
  set_down_handler([this](caf::down_msg& dm) { on_down(dm); });
  set_default_handler(drop_unexpected);
  if (!job_.events_file.empty()) {
    try {
      events_ = event_log{job_.events_file};
    } catch (const std::exception& e) {
      say("warning: {}", e.what());
    }
  }
  if (job_.event_observer)
    events_.observe(job_.event_observer);
  {
    coordinator_config cc;
    cc.elastic = elastic_;
    cc.torch_store = job_.torch_store;
    cc.start_timeout = job_.start_timeout;
    cc.elastic_timeout = ec_.elastic_timeout;
    cc.verbose = job_.verbose;
    cc.started = started_;
    coord_ = spawn_coordinator(system(), cc, caf::actor_cast<coordinator_client_actor>(this));
    monitor(coord_);
  }
  nlohmann::json start{
      {"kind", elastic_ ? "elastic" : "static"}, {"command", job_.command}, {"np", job_.np}};
  if (elastic_) {
    start["discovery_script"] = ec_.discovery_script;
    start["min_np"] = ec_.min_np;
    start["max_np"] = ec_.max_np ? nlohmann::json(*ec_.max_np) : nlohmann::json();
  } else {
    std::vector<std::string> hs;
    for (auto& h : job_.hosts)
      hs.push_back(job_.embedded ? std::string{"localhost"} : h.endpoint());
    start["hosts"] = hs;
  }
  events_.emit("job.start", start);
  if (executor())
    open_control(); // the owner's start frame begins the job
  else
    begin();
  return {
      [this](output_atom, output_batch& b) -> caf::result<caf::ok_atom> {
        if (!from_worker(b.rank, "output"))
          return refused_error("output");
        print_output(b);
        return output_acks_.after_write(this);
      },
      [this](output_atom, uint64_t id) {
        if (from_itself("an output acknowledgement"))
          output_acks_.written(id);
      },
      [this](exited_atom, rank_exit& ex) {
        if (from_worker(ex.rank, "an exit report"))
          on_exit(ex);
      },
      [this](interrupt_atom, int32_t sig) {
        if (from_itself("an interrupt"))
          on_interrupt(sig);
      },
      [this](deadline_atom, uint32_t which) {
        if (from_itself("a deadline"))
          on_deadline(which);
      },
      [this](tstore_atom, std::string& problem) {
        if (from_coordinator("a torch store problem"))
          on_store_problem(problem);
      },
      [this](discover_atom) {
        if (!from_itself("a discovery timer"))
          return;
        if (discovering_) {
          timer_missed_ = true;
          return;
        }
        timer_run_ = true;
        run_discovery();
      },
      [this](discover_atom, uint64_t) {
        // the table's nudge: ask it now (with a ticket, as every time)
        if (!ec_.cluster || done_
            || !admitted(this, sent_by(this, table_), "the job", "a nudge not from its table"))
          return;
        if (discovering_) {
          nudged_ = true;
          return;
        }
        timer_run_ = false;
        run_discovery();
      },
      [this](discover_atom, bool ok, std::string& text) {
        if (from_itself("a discovery result"))
          on_discovered(ok, text);
      },
      [this](notified_atom, uint64_t g, std::string& slot, std::string& problem) {
        if (from_coordinator("a notification result"))
          on_notified(g, slot, problem);
      },
      [this](reached_atom, uint64_t g, std::string& key, bool cross, bool connected) {
        if (from_coordinator("a rendezvous progress"))
          on_reached(g, key, cross, connected);
      },
      [this](parked_atom, uint64_t g, std::string& key) {
        if (from_coordinator("a parked newcomer"))
          on_parked(g, key);
      },
      [this](complete_atom, uint64_t g) {
        if (from_coordinator("a complete barrier"))
          on_complete(g);
      },
      [this](rejoin_atom, std::string& key) {
        if (from_coordinator("a rejoin request"))
          on_rejoin_request(key);
      },
      [this](late_atom, uint64_t g, std::vector<std::string>& fresh,
             std::vector<std::string>& carrying) {
        if (from_coordinator("late slots"))
          on_late(g, fresh, carrying);
      },
      [this](event_atom, std::string& name, std::string& context) {
        // the coordinator's, and this process's refusals of peers (posted as the job)
        if (sent_by_itself(this) || from_coordinator("an event"))
          events_.emit(name.c_str(), nlohmann::json::parse(context, nullptr, false));
      },
      [this](caf::get_atom) -> caf::result<coordinator_full_actor> {
        // for this process's own tools and tests
        auto sender = current_sender();
        if (!sender || sender->node() != node())
          return refused_error("the coordinator");
        return coord_;
      },
      [this](rejoin_atom, uint64_t gen) {
        if (from_itself("a rejoin timer"))
          on_rejoin(gen);
      },
      [this](result_atom, uint32_t slot, uint64_t id, std::string& payload) {
        if (from_worker(slot, "a result"))
          on_result(slot, id, std::move(payload));
      },
      [this](log_atom, uint32_t slot, std::string& payload) -> caf::result<caf::ok_atom> {
        if (!from_worker(slot, "a log record"))
          return refused_error("log record");
        return on_log(slot, std::move(payload));
      },
      [this](log_atom, uint64_t id) {
        if (!from_itself("a log acknowledgement"))
          return;
        if (auto it = log_acks_.find(id); it != log_acks_.end()) {
          it->second.deliver(caf::ok_atom::value);
          log_acks_.erase(it);
        }
      },
      [this](drain_atom, std::string& node, bool on, std::string& how) {
        if (from_colocator_of(node, "a drain notice"))
          on_drain(node, on, how);
      },
      [this](cancel_atom, std::string& node, std::string& by) {
        if (from_colocator_of(node, "a cancel notice"))
          fail(fmt::format("the job was cancelled by {} ('caf-hvd cancel'; node {} stops its "
                           "ranks)",
                           by, node));
      },
      [this](chanfail_atom, uint32_t slot, std::string& what) {
        if (!from_worker(slot, "a channel failure"))
          return;
        if (auto* s = slot_by_id(slot)) {
          s->channel_problem = what;
          log("rank {} ({}) broke its executor channel: {}", s->rank, s->key, what);
        }
      },
      [this](control_atom, uint8_t kind, uint64_t id, uint32_t rank, uint32_t deadline,
             std::string& payload) {
        if (from_itself("an owner's frame"))
          on_control(kind, id, rank, deadline, std::move(payload));
      },
      [this](chanend_atom, std::string& problem) {
        if (from_itself("an owner's channel end"))
          on_owner_gone(problem);
      },
      [this](probed_atom, std::string& ep, std::string& address, std::string& problem) {
        if (!from_itself("a reachability result"))
          return;
        if (auto it = hosts_.find(ep); it != hosts_.end() && !address.empty())
          it->second.address = address;
        on_reachable(ep, problem);
      },
      // A stop escalates: SIGTERM, then SIGKILL after the grace period.
      [this](retire_atom, uint32_t id, int32_t sig) {
        if (!from_itself("a retire timer"))
          return;
        auto* s = slot_by_id(id);
        if (!s || !s->running || !s->retired || !s->worker)
          return;
        send(s->worker, terminate_atom::value, sig);
        if (sig == SIGTERM)
          delayed_send(this, job_.kill_grace, retire_atom::value, id, int32_t{SIGKILL});
      },
  };
}

void job::begin() {
  if (elastic_) {
    send(this, discover_atom::value);
  } else {
    phase("connect");
    start_fixed_hosts();
  }
}

long job::elapsed_ms() const {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - started_).count());
}

std::string job::describe(const caf::error& e) {
  return system().render(e);
}

bool job::from_worker(uint32_t slot, const char* what) {
  auto* s = slot_by_id(slot);
  if (s && sent_by(this, s->worker))
    return true;
  return admitted(this, false, "the job", fmt::format("{} for slot {}", what, slot));
}

bool job::from_coordinator(const char* what) {
  return admitted(this, sent_by(this, coord_), "the job", what);
}

bool job::from_itself(const char* what) {
  return admitted(this, sent_by_itself(this), "the job", what);
}

bool job::from_colocator_of(const std::string& node, const char* what) {
  auto it = std::find_if(hosts_.begin(), hosts_.end(), [&](auto& kv) {
    return kv.second.info.name == node && sent_by(this, kv.second.colocator);
  });
  return admitted(this, it != hosts_.end(), "the job", what);
}

eslot* job::slot_by_id(uint32_t id) {
  auto it = slots_.find(id);
  return it == slots_.end() ? nullptr : &it->second;
}

// The slot's latest process, if it ever had one.
eslot* job::current(const std::string& key) {
  auto it = current_.find(key);
  return it == current_.end() ? nullptr : slot_by_id(it->second);
}

bool job::is_current(const eslot& s) const {
  auto it = current_.find(s.key);
  return it != current_.end() && it->second == s.id;
}

ehost* job::host_by_name(const std::string& name) {
  for (auto& [ep, h] : hosts_)
    if (h.info.name == name && h.st == ehost::status::ready)
      return &h;
  return nullptr;
}

bool job::in_plan(const std::string& key) const {
  return gen_.rows.count(key) > 0;
}

void job::maybe_finish() {
  if (!finishing_ && !done_)
    return;
  for (auto& [id, s] : slots_)
    if (s.running)
      return;
  finish();
}

void job::on_interrupt(int32_t sig) {
  if (interrupted_) {
    for (auto& [ep, h] : hosts_)
      if (h.colocator)
        send(h.colocator, kill_atom::value);
    return;
  }
  interrupted_ = sig;
  say("received {}; stopping the job", strsignal(sig));
  teardown();
}

void job::on_store_problem(const std::string& problem) {
  if (store_problems_++ == 0)
    write_all(2, torch_store_problem_message(problem));
  if (job_.torch_store == torch_store_mode::on)
    fail("the torch store could not serve a client (--torch-store on)");
}

void job::fail(const std::string& msg) {
  if (done_)
    return;
  failure_ = msg;
  failure_said_ = true;
  say("error: {}", msg);
  events_.emit("failure", {{"cause", msg}});
  teardown();
}

void job::teardown() {
  if (done_)
    return;
  done_ = true;
  if (!elastic_)
    phase("");
  events_.emit("phase.begin", {{"phase", "teardown"}});
  drop_unlaunched();
  send(coord_, stop_atom::value); // ranks waiting for a generation hear there is none
  for (auto& [ep, h] : hosts_)
    if (h.colocator && h.st == ehost::status::ready)
      send(h.colocator, terminate_atom::value, static_cast<int32_t>(job_.kill_grace.count()));
  delayed_send(this, job_.kill_grace + std::chrono::seconds(5), deadline_atom::value,
               uint32_t{dl_teardown});
  maybe_finish();
}

void job::on_deadline(uint32_t which) {
  auto kind = which & 0xf;
  auto serial = which >> 4;
  if (kind == dl_teardown && done_) {
    std::vector<int> left;
    for (auto& [id, s] : slots_)
      if (s.running)
        left.push_back(s.rank);
    if (!left.empty())
      say("ranks {} did not report their end within the grace period; releasing their nodes",
          fmt::join(left, ", "));
    finish();
  } else if (kind == dl_slots && waiting_slots_ && serial == slot_wait_serial_ && !done_) {
    int total = 0;
    for (auto& ep : order_)
      total += hosts_.at(ep).slots();
    std::vector<std::string> unusable; // listed hosts the job could not use, and why
    for (auto& [ep, h] : hosts_)
      if (h.listed && h.st != ehost::status::ready && !h.last_warning.empty())
        unusable.push_back(fmt::format("{} ({})", ep, h.last_warning));
    fail(fmt::format("elastic timeout ({} s) expired waiting for at least {} slots "
                     "(--min-np); available: {}{}{}",
                     ec_.elastic_timeout.count() / 1000.0, ec_.min_np, available_text(total),
                     unusable.empty() ? ""
                                      : fmt::format("; not usable: {}", fmt::join(unusable, "; ")),
                     first_failure_ ? "; first failure: " + *first_failure_ : std::string{}));
  } else if (kind == dl_owner && !owner_started_ && !done_) {
    fail(fmt::format("start timeout ({} s) expired waiting for the executor's owner to send "
                     "its start frame",
                     job_.start_timeout.count() / 1000.0));
  } else if (kind == dl_shutdown && !finished_) {
    std::vector<int> left;
    for (auto& [id, s] : slots_)
      if (s.running)
        left.push_back(s.rank);
    say("ranks {} did not end within {} s of closing their channels; stopping them",
        fmt::join(left, ", "), job_.kill_grace.count() / 1000.0);
    teardown();
  } else if (kind == dl_rendezvous) {
    rendezvous_overdue(serial);
  } else if (kind == dl_verdict) {
    judge_abort(serial);
  } else if (kind == dl_start && !elastic_ && !all_started_ && !done_) {
    fail(fmt::format("start timeout ({} s) expired waiting for: {}",
                     job_.start_timeout.count() / 1000.0, start_waits_for()));
  }
}

void job::finish() {
  if (finished_)
    return;
  finished_ = true;
  for (auto& [id, s] : slots_)
    if (s.worker)
      send_exit(s.worker, caf::exit_reason::user_shutdown);
  for (auto& [ep, h] : hosts_)
    if (h.colocator)
      send_exit(h.colocator, caf::exit_reason::user_shutdown);
  send_exit(coord_, caf::exit_reason::user_shutdown); // its servers close with it
  for (auto& [key, fds] : output_fds_)
    for (int fd : fds)
      if (fd >= 0)
        close_output(fd);
  output_fds_.clear();
  int code = 0;
  if (interrupted_) {
    code = 128 + interrupted_;
  } else if (interrupted_by_owner_ && !failure_) {
    code = 0; // the owner asked for the end before the ranks finished
  } else if (failure_) {
    code = failure_code_;
  } else {
    // Success: every rank of the final generation exited 0 (the fresh slots of a plan
    // that was never released had no process).
    for (auto& [key, row] : gen_.rows) {
      if (!gen_.released && gen_.fresh.count(key))
        continue;
      auto* s = current(key);
      if (!s || s->exit_code != 0) {
        code = 1;
        failure_ =
            fmt::format("rank {} ({}) of the final generation did not exit 0", row.rank, key);
        break;
      }
    }
  }
  if (failure_ && !interrupted_ && !failure_said_)
    say("job failed: {}", *failure_);
  log("job ends with exit code {} after {} generations", code, gen_.number);
  if (!elastic_ && !done_)
    phase("");
  summarize(code);
  if (done_)
    events_.emit("phase.end", {{"phase", "teardown"}});
  events_.emit("job.end", {{"code", code},
                           {"generations", gen_.number},
                           {"cause", failure_ ? nlohmann::json(*failure_) : nlohmann::json()}});
  end_for_owner(code);
  result_->exit_code = code;
  quit();
}

} // namespace cafhvd::driver_impl

namespace cafhvd {

driver_full_actor spawn_driver(caf::actor_system& sys, job_config config,
                               std::shared_ptr<job_result> result) {
  return caf::actor_cast<driver_full_actor>(
      sys.spawn<driver_impl::job>(std::move(config), std::move(result)));
}

} // namespace cafhvd
