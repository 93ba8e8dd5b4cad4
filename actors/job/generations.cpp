// The job actor's generations: whether the hosts at hand call for a new plan, the plan
// from the coordinator, the generation's start (carried and fresh slots, the barrier
// handed to the coordinator), its release, re-join requests and late joiners.
#include "actors/job/job_actor.hpp"

namespace cafhvd::driver_impl {

// Decides whether the available hosts call for a (new) generation.
void job::reconsider() {
  if (done_ || finishing_)
    return;
  if (!served_) {
    // No host became ready yet (the servers start with the first): an elastic job waits
    // for its --min-np slots up to --elastic-timeout all the same, also when every host
    // it discovers is unreachable.
    if (elastic_ && gen_.number == 0)
      wait_for_slots(0, false);
    return;
  }
  if (!elastic_)
    return start_fixed_generation();
  // Hosts listed together join together, in the order listed (deterministic), unless a
  // failure makes the job wait: then the next generation forms from the hosts at hand.
  bool plan_broken = rejoin_due_;
  for (auto& [key, row] : gen_.rows) {
    auto* h = host_by_name(row.hostname);
    plan_broken = plan_broken || !h || h->blacklisted || !h->listed;
  }
  if (!plan_broken)
    for (auto& [ep, h] : hosts_)
      if (h.listed && !h.blacklisted && h.st == ehost::status::connecting)
        return;
  std::vector<std::string> available;
  for (auto& ep : listed_order_) {
    auto it = hosts_.find(ep);
    if (it != hosts_.end() && it->second.st == ehost::status::ready && !it->second.blacklisted
        && it->second.listed)
      available.push_back(ep);
  }
  auto before = order_;
  order_ = order_hosts(before, available);
  bool survives = gen_.number == 0 || previous_generation_survives();
  // a draining node kept as the carrier of the job's only state
  std::string kept = survives ? std::string{} : draining_carrier(before);
  if (!kept.empty()) {
    // The drain would take the job's only training state with it: its node stays in the
    // plan with one rank, the state's carrier (rank 0 of the plan, as it is the oldest
    // host), beside the hosts at hand; once their newcomers finished hvd.init() (and so
    // were sent the state) the next plan leaves it (on_reached).
    auto& h = hosts_.at(kept);
    if (order_.empty()) {
      order_ = {kept}; // the oldest host still: rank 0's once others come
      if (carrier_told_.insert({kept, released_gen_}).second)
        say("node {} drains and its ranks hold the job's only training state (generation "
            "{}): the job runs on there until another host is listed to carry the state over, "
            "or the drain stops them",
            h.info.name, released_gen_);
      return;
    }
    available.push_back(kept);
    order_ = order_hosts(before, available);
    if (carrier_told_.insert({kept, released_gen_}).second) {
      say("node {} drains and its ranks hold the job's only training state (generation {}): "
          "its rank {} stays in the next plan to carry the state to the new hosts, and the "
          "node is left once they hold it",
          h.info.name, released_gen_, current(slot_key(h.info.name, 0))->rank);
      events_.emit("host.carries", {{"host", h.info.name}, {"generation", released_gen_}});
    }
  }
  carrier_kept_ = kept;
  std::vector<host_slots> hs;
  int total = 0;
  for (auto& ep : order_) {
    auto& h = hosts_.at(ep);
    int n = ep == kept ? 1 : h.slots();
    hs.push_back({h.info.name, n});
    total += n;
  }
  if (!survives && kept.empty()) {
    bool all_black =
        std::all_of(hosts_.begin(), hosts_.end(), [](auto& p) { return p.second.blacklisted; });
    auto first = first_failure_ ? "; first failure: " + *first_failure_ : std::string{};
    if (all_black)
      return fail(fmt::format("every host is blacklisted; first failure: {}",
                              first_failure_.value_or("none")));
    if (released_gen_ == 0)
      return fail(fmt::format("no host of generation {} is left to carry the job's state "
                              "over{}",
                              gen_.number, first));
    return fail(fmt::format("no host of generation {} is left to carry the job's state over: "
                            "the training state was lost with the last host of the previous "
                            "generation ({}){}",
                            released_gen_, fmt::join(plan_host_names(released_plan_), ","), first));
  }
  if (total < ec_.min_np) {
    wait_for_slots(total);
    return;
  }
  assign(hs, ec_.min_np, ec_.max_np.value_or(0));
}

// The coordinator places the ranks over `hs`; a newer request supersedes this one.
void job::assign(const std::vector<host_slots>& hs, int min_np, int max_np) {
  auto serial = ++assign_serial_;
  request(coord_, job_.start_timeout, assign_atom::value, hs, static_cast<int32_t>(min_np),
          static_cast<int32_t>(max_np))
      .then(
          [this, serial, hs](assignment& a) {
            if (serial != assign_serial_ || done_ || finishing_)
              return;
            if (!a.error.empty())
              return fail(a.error);
            plan_ready(std::move(a.plan), hs);
          },
          [this](caf::error& e) {
            fail(fmt::format("the job's coordinator did not place the ranks: {}", describe(e)));
          });
}

void job::plan_ready(std::vector<slot_info> plan, const std::vector<host_slots>& hs) {
  if (!elastic_)
    return begin_generation(std::move(plan), hs);
  waiting_slots_ = slot_wait_told_ = false;
  if (gen_.number > 0 && plan == gen_.plan && !rejoin_due_)
    return; // e.g. hosts beyond --max-np appeared: no reset
  // Horovod counts resets done (barriers completed), not plans formed: a plan replaced
  // before its release, or one that only re-joins, costs the job nothing.
  if (gen_.number > 0 && ec_.reset_limit && resets_ >= static_cast<uint64_t>(*ec_.reset_limit))
    return fail(
        fmt::format("the job has been reset {} times, which reaches the reset limit "
                    "(--reset-limit {}); stopping{}",
                    resets_, *ec_.reset_limit,
                    first_failure_ ? " (last failure: " + *last_failure_ + ")" : std::string{}));
  begin_generation(std::move(plan), hs);
}

// "The previous generation" is the last released one, the only one whose ranks hold
// training state: one of its ranks must run on a host of the next plan. Before any
// release, a host of the forming generation must stay (nothing to carry yet, but a
// program that never votes keeps its ranks only that way).
// A static job has one generation, over every given host once all are ready.
void job::start_fixed_generation() {
  if (gen_.number > 0)
    return;
  std::vector<host_slots> hs;
  for (auto& ep : listed_order_) {
    auto& h = hosts_.at(ep);
    if (h.st != ehost::status::ready)
      return;
    hs.push_back({h.info.name, h.planned});
  }
  order_ = listed_order_;
  assign(hs, job_.np, job_.np);
}

bool job::previous_generation_survives() const {
  std::set<std::string> available;
  for (auto& ep : order_)
    available.insert(hosts_.at(ep).info.name);
  if (released_gen_ == 0) {
    for (auto& s : gen_.plan)
      if (available.count(s.hostname))
        return true;
    return gen_.plan.empty();
  }
  // No rank ever finished a Gloo rendezvous: nothing trained, no state to lose, so the
  // next plan starts afresh (the processes still inside their first one were restarted).
  if (speaks_gloo_ && !state_made())
    return true;
  // No process of the job was ever started (its first plan's node refused its ranks, or
  // was lost before they started): nothing ran, nothing to lose.
  if (std::none_of(slots_.begin(), slots_.end(), [](auto& p) { return p.second.launched; }))
    return true;
  std::vector<slot_process> procs;
  for (auto& [id, s] : slots_)
    procs.push_back(process_of(s));
  return !state_carriers(released_gen_, procs, available).empty();
}

// A node that drains (ready, not blacklisted) whose local rank 0 runs and carries the last
// released generation's state: the job may keep it as the state's carrier when no other
// host has the state (the first such node in the job's host order); "" if none.
std::string job::draining_carrier(const std::vector<std::string>& order) {
  if (released_gen_ == 0)
    return {};
  for (auto& ep : order_hosts(order, ever_listed_)) {
    auto& h = hosts_.at(ep);
    if (!h.draining || h.blacklisted || h.st != ehost::status::ready)
      continue;
    auto* s = current(slot_key(h.info.name, 0));
    if (!s || s->endpoint != ep)
      continue;
    std::set<std::string> here{h.info.name};
    if (!state_carriers(released_gen_, {process_of(*s)}, here).empty())
      return ep;
  }
  return {};
}

slot_process job::process_of(const eslot& s) const {
  auto& h = hosts_.at(s.endpoint);
  return {s.key, h.info.name, s.started, s.joined, s.running && !s.retired, holds_state(s)};
}

void job::wait_for_slots(int total, bool tell) {
  if (!waiting_slots_) {
    waiting_slots_ = true;
    ++slot_wait_serial_;
    delayed_send(this, ec_.elastic_timeout, deadline_atom::value,
                 dl_slots | (slot_wait_serial_ << 4));
  }
  if (tell && !slot_wait_told_) {
    slot_wait_told_ = true;
    say("waiting up to {} s for at least {} slots (--min-np); available now: {}",
        ec_.elastic_timeout.count() / 1000.0, ec_.min_np, available_text(total));
  }
}

std::string job::available_text(int total) {
  std::string hosts;
  for (auto& ep : order_) {
    auto& h = hosts_.at(ep);
    hosts += fmt::format("{}{} ({} slots)", hosts.empty() ? "" : ", ", h.info.name, h.slots());
  }
  return fmt::format("{} slots{}", total, hosts.empty() ? "" : " on " + hosts);
}

void job::begin_generation(std::vector<slot_info> plan, const std::vector<host_slots>& hs) {
  auto change = gen_.number == 0 ? host_change::added : compare_hosts(plan_hosts_, hs);
  std::vector<std::string> added, removed;
  {
    std::set<std::string> before, after;
    for (auto& h : plan_hosts_)
      before.insert(h.hostname);
    for (auto& h : hs)
      after.insert(h.hostname);
    for (auto& h : hs)
      if (!before.count(h.hostname))
        added.push_back(h.hostname);
    for (auto& h : plan_hosts_)
      if (!after.count(h.hostname))
        removed.push_back(h.hostname);
  }
  rejoin_wanted_ = false;
  rejoin_due_ = false;
  auto reason = std::exchange(reset_reason_, std::string{});
  // The plan is the released one again (a newcomer of the plan it replaces failed before
  // the running ranks were told of it): they go on as they are, never interrupted.
  bool resume = elastic_ && released_gen_ > 0 && !gen_.released && !notice_sent_ && reason.empty()
                && !gen_reason_after_failure_ && plan == released_plan_;
  gen_reason_after_failure_ = !reason.empty();
  notice_sent_ = false;
  held_notice_.reset();
  held_for_newcomers_ = 0;
  gen_ = generation{gen_.number + 1, std::move(plan), clock_type::now()};
  // Newcomers waiting for a plan that will not run: they hold nothing and restart for
  // this one if it has their slots.
  stop_newcomers(gen_.number);
  auto plan_host_names = gen_.hosts();
  plan_hosts_.clear();
  for (auto& h : hs)
    if (std::count(plan_host_names.begin(), plan_host_names.end(), h.hostname))
      plan_hosts_.push_back(h);
  // Running slots that are no longer in the job will be answered -1 and are stopped
  // if they do not end by themselves.
  for (auto& [id, s] : slots_)
    if (s.running && !s.retired && !in_plan(s.key))
      retire_slot(s.key);
  std::string text = fmt::format("generation {}\nchange {}\n", gen_.number, to_string(change));
  for (auto& h : added)
    text += "added " + h + "\n";
  for (auto& h : removed)
    text += "removed " + h + "\n";
  std::string layout;
  for (auto& h : plan_hosts_)
    layout += fmt::format("{}{}:{}", layout.empty() ? "" : ",", h.hostname,
                          std::count_if(gen_.plan.begin(), gen_.plan.end(),
                                        [&](auto& s) { return s.hostname == h.hostname; }));
  link_rank_outputs();
  gen_formed_.emplace_back(gen_.number, clock_type::now());
  for (auto& r : removed)
    if (auto it = host_end_.find(r); it != host_end_.end() && it->second.empty())
      it->second = "removed";
  for (auto& a : added) // back after a removal (a drained node undrained)
    if (auto it = host_end_.find(a); it != host_end_.end() && it->second == "removed")
      it->second.clear();
  if (!elastic_)
    phase("launch");
  if (events_.enabled()) { // per-rank contexts are built only for a log that is written
    nlohmann::json plan = nlohmann::json::array();
    for (auto& row : gen_.plan)
      plan.push_back({{"rank", row.rank}, {"host", row.hostname}, {"local_rank", row.local_rank}});
    events_.emit("generation.begin", {{"generation", gen_.number},
                                      {"size", gen_.plan.size()},
                                      {"hosts", gen_.hosts()},
                                      {"added", added},
                                      {"removed", removed},
                                      {"reason", reason},
                                      {"plan", plan}});
  }
  if (elastic_ && resume) {
    say("generation {}: {} ranks on {}, as released (the plan it replaces was never told to "
        "the running ranks: they go on)",
        gen_.number, gen_.plan.size(), layout);
  } else if (elastic_) {
    say("generation {}: {} ranks on {}{}{}{}", gen_.number, gen_.plan.size(), layout,
        added.empty() || gen_.number == 1 ? "" : fmt::format(" (added {})", fmt::join(added, ",")),
        removed.empty() ? "" : fmt::format(" (removed {})", fmt::join(removed, ",")),
        added.empty() && removed.empty() && !reason.empty() ? " (" + reason + ")" : std::string{});
  } else {
    log("{} ranks on {}", gen_.plan.size(), layout);
  }
  // Processes that run carry over and learn their place through rank_and_size; the
  // other slots are fresh: their processes start when the plan is released. A worker
  // spawned for an earlier plan whose process has not been asked for yet is fresh too.
  std::map<std::string, std::vector<std::pair<std::string, slot_info>>> fresh; // by host
  std::vector<std::string> host_order;
  for (size_t r = 0; r < gen_.plan.size() && !done_; ++r) {
    auto& row = gen_.plan[r];
    auto key = slot_key(row.hostname, row.local_rank);
    auto* s = current(key);
    if (s && s->running && !s->retired) {
      s->rank = row.rank;
      if (!s->launching)
        gen_.fresh.insert(key);
      continue;
    }
    gen_.fresh.insert(key);
    if (!fresh.count(row.hostname))
      host_order.push_back(row.hostname);
    fresh[row.hostname].emplace_back(key, row);
  }
  // The coordinator holds the barrier: the processes the plan carries over vote, the
  // fresh slots' processes start at the release. No barrier for the first plan
  // (Horovod's static rendezvous, and horovodrun's first elastic generation): it is
  // the job's from the start.
  barrier_spec spec;
  spec.number = gen_.number;
  spec.plan = gen_.plan;
  spec.fresh.assign(gen_.fresh.begin(), gen_.fresh.end());
  for (auto& [key, row] : gen_.rows)
    if (auto* s = current(key); s && !gen_.fresh.count(key))
      spec.carried.push_back(
          {key, row.hostname,
           std::chrono::duration_cast<std::chrono::nanoseconds>(s->started.time_since_epoch())
               .count(),
           s->joined});
  spec.update = text;
  spec.release_now = !elastic_ || gen_.number == 1 || resume;
  spec.resume = resume;
  bool warm = !resume && warm_plan();
  spec.hold_update = (warm && reason.empty()) || resume; // a resumed plan changes nothing
  send(coord_, barrier_atom::value, std::move(spec));
  if (!elastic_ || gen_.number == 1 || resume)
    release_generation(resume);
  if (warm)
    open_lot();
  // Workers of fresh slots are spawned now; their processes wait for the release.
  for (auto& host : host_order)
    if (!done_)
      start_slots(host, fresh[host]);
  if (job_.torch_store == torch_store_mode::off)
    find_master_port();
  if (!elastic_ || gen_.released)
    return;
  if (!reason.empty())
    return;
  // The running ranks compare the notice with what they were released with: combined
  // against that plan. It never says "removed" alone: on such a notice Horovod's ranks
  // skip state.sync() (HostsUpdatedInterrupt(skip_sync=True)), and when a plan with
  // fresh slots replaces this one before they re-join (its notice held for its
  // newcomers, or never delivered: rank 0 left), the newcomers wait in a sync the
  // others skipped, for ever (a soak job hung so). A sync more on a removal costs one
  // broadcast of the state.
  auto notice = static_cast<unsigned>(compare_hosts(released_hosts_, plan_hosts_));
  notice |= static_cast<unsigned>(host_change::added);
  events_.emit("notify.change", {{"generation", gen_.number},
                                 {"change", to_string(static_cast<host_change>(notice))}});
  if (warm) { // told once every newcomer waits at its first rendezvous
    held_notice_ = static_cast<uint8_t>(notice);
    return;
  }
  notice_sent_ = true;
  send(coord_, notify_atom::value, gen_.number, static_cast<uint8_t>(notice));
}

// A slot that joined the released generation asks for the next one: a failure's report
// usually follows at once; if none does, a new generation starts anyway.
void job::on_rejoin_request(const std::string& key) {
  if (done_ || finishing_ || rejoin_wanted_)
    return;
  rejoin_wanted_ = true;
  log("{} asks for a new generation; waiting briefly for the failure's report", key);
  delayed_send(this, std::chrono::milliseconds(1000), rejoin_atom::value, gen_.number);
}

// No failure explains a rank's request for a new generation: start one anyway.
void job::on_rejoin(uint64_t gen) {
  if (gen != gen_.number || !rejoin_wanted_ || done_ || finishing_)
    return;
  say("ranks asked to re-join without a reported failure; starting a new generation");
  rejoin_due_ = true;
  reset_reason_ = "ranks asked to re-join";
  reconsider();
}

// Slots whose join deadline passed: a fresh one is a failure (its host is blacklisted);
// one that holds state is first asked whether it is alive (on_alive).
void job::on_late(uint64_t g, const std::vector<std::string>& fresh,
                  const std::vector<std::string>& carrying) {
  if (g != gen_.number || gen_.released || done_ || finishing_)
    return;
  for (auto& key : carrying) {
    auto* s = current(key);
    if (!s || !s->worker) {
      late_failed(g, key, "its worker is gone");
      continue;
    }
    auto id = s->id;
    request(s->worker, std::chrono::seconds(5), alive_atom::value)
        .then([this, g, key, id](uint32_t ms) { on_alive(g, key, id, ms); },
              [this, g, key, id](caf::error& e) {
                if (auto* s = slot_by_id(id); s && is_current(*s))
                  late_failed(g, key, fmt::format("its node did not say whether it is alive: {}",
                                                  describe(e)));
              });
  }
  if (fresh.empty())
    return;
  std::vector<std::string> names;
  std::set<std::string> bad_hosts;
  for (auto& key : fresh) {
    names.push_back(fmt::format("rank {} ({})", gen_.rows.at(key).rank, key));
    if (auto* s = current(key))
      bad_hosts.insert(s->endpoint);
  }
  auto what = fmt::format("{} did not join generation {} within {} s (--start-timeout; does the "
                          "program call rank_and_size, e.g. through an elastic run loop?)",
                          fmt::join(names, ", "), gen_.number, job_.start_timeout.count() / 1000.0);
  note_failure(what);
  say("{}", what);
  for (auto& ep : bad_hosts)
    blacklist(ep);
  reconsider();
}

// A slot that holds state missed generation G's join deadline; its worker says it showed a
// sign of life `ms` ago. Within --elastic-timeout it is slow, not dead: the barrier waits
// for it from its last sign of life. Otherwise it counts as failed.
void job::on_alive(uint64_t g, const std::string& key, uint32_t id, uint32_t ms) {
  auto* s = slot_by_id(id);
  if (g != gen_.number || gen_.released || done_ || finishing_ || !s || !is_current(*s))
    return;
  auto idle = std::chrono::milliseconds(ms);
  if (idle < ec_.elastic_timeout) {
    if (slow_told_.insert({g, key}).second) {
      say("generation {} waits for rank {} ({}): it holds the state of generation {} and is "
          "still in its step (its last sign of life, CPU time or output, {:.1f} s ago; it is "
          "waited for until it shows none for {} s, --elastic-timeout)",
          g, gen_.rows.at(key).rank, key, released_gen_, ms / 1000.0,
          ec_.elastic_timeout.count() / 1000.0);
      events_.emit("rank.slow", {{"generation", g}, {"slot", key}, {"idle_ms", ms}});
    } else {
      log("rank {} ({}) is still alive ({} ms since its last sign of life)", gen_.rows.at(key).rank,
          key, ms);
    }
    send(coord_, alive_atom::value, g, key, ms);
    return;
  }
  late_failed(g, key,
              fmt::format("it showed no sign of life (no CPU time used, no output) for {} s",
                          ms / 1000.0));
}

// A slot that holds state missed generation G's join deadline and is not alive (why):
// it counts as failed, and its host is blacklisted.
void job::late_failed(uint64_t g, const std::string& key, const std::string& why) {
  if (g != gen_.number || gen_.released || done_ || finishing_)
    return;
  auto what = fmt::format("rank {} ({}) did not join generation {} within {} s (--elastic-timeout; "
                          "it holds the state of generation {} and was waited for while it ran): "
                          "{}",
                          gen_.rows.at(key).rank, key, gen_.number,
                          ec_.elastic_timeout.count() / 1000.0, released_gen_, why);
  note_failure(what);
  say("{}", what);
  if (auto* s = current(key))
    blacklist(s->endpoint);
  reconsider();
}

// Every process generation G carries over voted: it is released (unless the job has
// moved on; the held votes then carry over to the next generation).
void job::on_complete(uint64_t g) {
  if (g != gen_.number || gen_.released || done_ || finishing_)
    return;
  if (aborts_in_flight_ > 0) {
    // the broken generation's Gloo connections are still being shut down
    held_complete_ = g;
    return log("generation {} waits for the Gloo aborts to be answered", g);
  }
  if (!newcomers_ready()) {
    // released only with every newcomer at its first rendezvous: one lost now costs
    // the running ranks nothing
    held_for_newcomers_ = g;
    return log("generation {} waits for its newcomers to reach their first rendezvous", g);
  }
  log("generation {}: all {} ranks it carries over joined", gen_.number,
      gen_.plan.size() - gen_.fresh.size());
  send(coord_, release_atom::value, g);
  release_generation();
  // The fresh slots' processes start now, with the released plan.
  std::map<std::string, std::vector<uint32_t>> by_host;
  for (auto id : std::exchange(awaiting_release_, {}))
    if (auto* s = slot_by_id(id); s && s->running && !s->retired && s->worker && !s->launching)
      by_host[s->endpoint].push_back(id);
  for (auto& [ep, ids] : by_host)
    launch_slots(ep, ids);
}

// The plan becomes the job's (the coordinator gives it to the servers): the processes
// it carried over joined it.
void job::release_generation(bool resumed) {
  gen_.released = true;
  for (auto& [key, row] : gen_.rows)
    if (auto* s = current(key); s && s->launching && !gen_.fresh.count(key)) {
      s->joined = gen_.number;
      if (!resumed && elastic_)
        s->rendezvous_gen = gen_.number; // it re-joins: hvd.init() again
    }
  // its newcomers, parked at its lot, go on into its rendezvous
  for (auto& [id, s] : slots_)
    if (s.warm_for == gen_.number) {
      s.warm_for = 0;
      s.joined = s.rendezvous_gen = gen_.number;
    }
  lot_gen_ = 0;
  lot_port_ = 0;
  if (released_gen_ > 0 && !resumed)
    ++resets_;
  released_gen_ = gen_.number;
  released_plan_ = gen_.plan;
  released_hosts_ = plan_hosts_;
  // Slots that left the plan holding state acted on the notice with the others (their
  // vote was answered -1): they get the grace period to end by themselves.
  for (auto& [id, s] : slots_)
    if (s.stop_at_release && s.running && s.retired) {
      s.stop_at_release = false;
      delayed_send(this, job_.kill_grace, retire_atom::value, s.id, int32_t{SIGTERM});
    }
  events_.emit("generation.released", {{"generation", gen_.number}});
  if (elastic_)
    log("generation {} released: {} ranks, {} of them fresh", gen_.number, gen_.plan.size(),
        gen_.fresh.size());
  if (executor() && elastic_)
    send_rank_table();
}

// Elastic: drops the slots whose processes were never asked for (they wait for a
// release that will not come): nothing of theirs runs, so nothing reports their end.
// (A static job launches every slot of its one plan.)
void job::drop_unlaunched(bool keep_released) {
  for (auto& [id, s] : slots_)
    if (!(keep_released && gen_.released && in_plan(s.key) && is_current(s)))
      drop_if_unlaunched(s);
  awaiting_release_.clear();
}

bool job::drop_if_unlaunched(eslot& s) {
  if (!elastic_ || !s.running || s.launching || s.launched)
    return false;
  s.running = false;
  s.retired = true;
  if (s.worker) {
    demonitor(s.worker.address()); // its end is ours, not news of its node
    send_exit(s.worker, caf::exit_reason::user_shutdown);
  }
  return true;
}

// The coordinator told rank 0's notification service of generation G's host change
// (Horovod's HostsUpdatedRequest), or could not.
void job::on_notified(uint64_t g, const std::string& key, const std::string& problem) {
  events_.emit(
      "notify.sent",
      {{"slot", key}, {"generation", g}, {"delivered", problem.empty()}, {"cause", problem}});
  if (problem.empty())
    return log("rank 0 ({}) was told of generation {}'s host change", key, g);
  if (g == gen_.number && !gen_.released && !done_ && !finishing_)
    say("warning: could not tell rank 0 ({}) of the host change of generation {}: {}; its "
        "ranks learn of it only through /elastic/update or a failure",
        key, g, problem);
}

} // namespace cafhvd::driver_impl
