// The colocator: one node's share of a job. It spawns the node's workers (each holding
// one of the node's slots), launches them, and guarantees that none of the job's
// processes outlives the job, also when the driver vanishes.
#include "actors/node_actors.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <set>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "runtime/network/net.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/observe/text.hpp"
#include "runtime/network/socket_abort.hpp"

namespace cafhvd {

namespace {

// The colocator's workers: monitored once, whether counted at spawn or when they enlist.
void enlist(colocator_actor::stateful_pointer<colocator_state> self, worker_actor w) {
  auto& ws = self->state.workers;
  if (std::find(ws.begin(), ws.end(), w) != ws.end())
    return;
  self->monitor(w);
  ws.push_back(std::move(w));
}

} // namespace

colocator_actor::behavior_type colocator_fn(colocator_actor::stateful_pointer<colocator_state> self,
                                            driver_actor driver, coordinator_actor coordinator,
                                            std::string job, int32_t grace_ms,
                                            signed_ticket ticket) {
  self->state.driver = driver;
  self->state.coordinator = coordinator;
  auto& node = settings_of(self->system());
  std::string owner;
  if (node.creds) {
    try {
      auto holder = net::module().check_ticket(
          *node.creds, ticket, cert_role::driver, "colocator",
          colocator_audience(to_string(self->system().node()),
                             net::module().own_certificate(*node.creds)));
      if (holder.subject != job)
        throw credentials_error(fmt::format("it names job '{}'", printable(holder.subject)));
      owner = holder.name;
    } catch (const std::exception& e) {
      self->state.refused = fmt::format("node agent '{}' refused to run job {} for this peer: "
                                        "its driver ticket did not check out: {}",
                                        node.name, printable(job), e.what());
      std::fprintf(stderr, "caf-hvd node '%s': %s\n", node.name.c_str(),
                   self->state.refused.c_str());
    }
  }
  // The account the job's ranks run as: its owner's, when this agent switches users.
  if (self->state.refused.empty() && node.switch_users) {
    auto a = account_for(owner, node.rank_policy);
    if (a.id)
      self->state.account = std::make_shared<const rank_identity>(std::move(*a.id));
    else
      self->state.refused = fmt::format("node agent '{}' will not run job {}: {}", node.name,
                                        printable(job), a.error);
  }
  if (self->state.refused.empty() && node.draining->load())
    self->state.refused = fmt::format("node agent '{}' is drained: it takes no new jobs ('caf-hvd "
                                      "undrain {}' returns it)",
                                      node.name, node.name);
  if (!self->state.refused.empty()) {
    // Only the refusal is answered; the actor ends soon either way.
    self->delayed_send(self, std::chrono::seconds(5), kill_atom::value);
  } else {
    self->state.book = node.jobs;
    self->state.book_id = self->id();
    node.jobs->open(self->id(),
                    job_summary{job, owner, 0, {},
                                std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count()});
  }
  if (node.guardian) {
    self->link_to(node.guardian);
    send_from(self, node.guardian, enlist_atom::value, caf::actor_cast<caf::actor>(self));
  }
  self->monitor(driver);
  self->set_default_handler(drop_unexpected);
  // The colocator obeys the driver its ticket names, its agent (the guardian) and its own
  // threads and timers; anything else is refused and counted (actors/senders.hpp).
  auto from_driver = [=](const char* what) {
    return admitted(self, sent_by(self, self->state.driver), "a colocator", what);
  };
  auto from_agent = [=](const char* what) {
    return admitted(self, sent_by(self, settings_of(self->system()).guardian), "a colocator",
                    what);
  };
  auto from_itself = [=](const char* what) {
    return admitted(self, sent_by_itself(self), "a colocator", what);
  };
  // Each worker holds one of the node's slots (for every job together) until it is
  // gone: a job that does not fit is refused here, whatever placed it.
  auto take_slots = [=](const std::vector<uint32_t>& slots, std::string& why) {
    auto& st = self->state;
    auto taken = st.book->take(st.book_id, static_cast<uint32_t>(slots.size()), why);
    if (taken.size() != slots.size())
      return false;
    for (size_t i = 0; i < slots.size(); ++i)
      st.node_slot[slots[i]] = taken[i];
    return true;
  };
  auto cannot_start = [=](size_t n, const std::string& why) {
    return fmt::format("node agent '{}' cannot start {} rank{} of this job: {}",
                       settings_of(self->system()).name, n, n == 1 ? "" : "s", why);
  };
  auto spawn_workers = [=](const std::vector<uint32_t>& slots) {
    auto& st = self->state;
    std::vector<worker_actor> out;
    auto me = caf::actor_cast<colocator_actor>(self);
    for (auto id : slots) {
      // Spawned here only: workers are not offered for remote spawn.
      auto w = spawn_worker(self->system(), me, st.driver, st.coordinator, id, st.account);
      out.push_back(w);
      if (w) {
        st.by_slot[id] = w;
        // Counted from now, not from its enlist message (which the worker sends when
        // it first runs, possibly after a stop): a stop must reach every worker.
        enlist(self, w);
      } else if (st.coordinator) {
        // No worker will report this slot: the colocator accounts for it, so the
        // job hears of the failed spawn (an empty handle) at once, not at the
        // registration's deadline.
        self->send(st.coordinator, report_atom::value, id, settings_of(self->system()).name);
      }
    }
    return out;
  };
  // A replaced rank's old worker gets SIGTERM, and SIGKILL a grace period later: its
  // slot is waited for that long and a little more. (The job's request waits longer.)
  auto handover_wait = std::chrono::milliseconds(2 * std::max(grace_ms, 0) + 3000);
  // Workers requests waiting for a handover, in order, once one of this job's slots is back.
  auto hand_over = [=] {
    auto& st = self->state;
    for (auto it = st.handovers.begin(); it != st.handovers.end();) {
      std::string why;
      if (!take_slots(it->second.slots, why))
        return; // in order: a later request does not overtake an earlier one
      it->second.rp.deliver(spawn_workers(it->second.slots));
      it = st.handovers.erase(it);
    }
  };
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.driver) {
      // The driver is gone: stop this node's ranks as the driver would have.
      st.driver_gone = true;
      for (auto& [id, h] : st.handovers) // nobody will launch what they would spawn
        h.rp.deliver(caf::make_error(caf::sec::runtime_error, "the job's driver is gone"));
      st.handovers.clear();
      std::fprintf(stderr, "caf-hvd node '%s': job %s: driver lost; stopping its %zu ranks\n",
                   settings_of(self->system()).name.c_str(), job.c_str(), st.workers.size());
      if (st.workers.empty()) {
        self->quit(caf::exit_reason::user_shutdown);
        return;
      }
      // A worker whose launch never came has no process to stop and no launch to wait
      // for (only this colocator launches, and nothing more comes from a lost driver): it
      // ends now, and its node slot is free once it is gone. The others get SIGTERM, and
      // SIGKILL after the grace period.
      for (auto& [slot, w] : st.by_slot)
        if (!st.pids.count(slot) && !st.launching.count(slot))
          self->send_exit(w, caf::exit_reason::user_shutdown);
      for (auto& w : st.workers)
        self->send(w, terminate_atom::value, int32_t{SIGTERM});
      self->delayed_send(self, std::chrono::milliseconds(grace_ms), kill_atom::value);
      return;
    }
    auto it = std::find_if(st.workers.begin(), st.workers.end(),
                           [&](auto& w) { return w.address() == dm.source; });
    if (it != st.workers.end())
      st.workers.erase(it);
    for (auto s = st.by_slot.begin(); s != st.by_slot.end(); ++s)
      if (s->second.address() == dm.source) {
        st.pids.erase(s->first);
        if (auto n = st.node_slot.find(s->first); n != st.node_slot.end()) {
          if (st.book)
            st.book->give_back(st.book_id, n->second);
          st.node_slot.erase(n);
        }
        st.by_slot.erase(s);
        hand_over();
        break;
      }
    if ((st.driver_gone || st.stopping) && st.workers.empty())
      self->quit(caf::exit_reason::user_shutdown);
  });
  return {
      [=](node_atom) -> caf::result<node_info> {
        if (!from_driver("a node info request"))
          return refused_error("node info");
        if (!self->state.refused.empty()) {
          auto why = self->state.refused;
          self->quit(caf::exit_reason::user_shutdown);
          return caf::make_error(caf::sec::runtime_error, why);
        }
        auto& n = settings_of(self->system());
        char host[256] = {};
        gethostname(host, sizeof(host) - 1);
        auto& st = self->state;
        if (!st.responder) {
          try {
            st.responder = std::make_unique<probe_responder>(n.name);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "caf-hvd node '%s': %s\n", n.name.c_str(), e.what());
          }
        }
        return node_info{n.name,
                         host,
                         static_cast<int32_t>(getpid()),
                         n.slots,
                         list_interfaces(),
                         st.responder ? st.responder->port() : uint16_t{0},
                         n.gpus->devices(),
                         n.gpus->free(),
                         n.gpu_source,
                         st.account ? st.account->uid : static_cast<uint32_t>(::getuid()),
                         n.draining->load()};
      },
      // Probing blocks for up to a timeout: it runs on a thread of its own and reports
      // back with probed_atom.
      [=](probe_atom, std::vector<probe_target>& targets,
          std::vector<std::string>& wanted) -> caf::result<std::vector<probe_result>> {
        if (!from_driver("a NIC probe request"))
          return refused_error("NIC probe");
        if (!self->state.refused.empty())
          return caf::make_error(caf::sec::runtime_error, self->state.refused);
        auto& n = settings_of(self->system());
        std::vector<interface_addr> local;
        try {
          local = candidate_interfaces(host_interfaces{n.name, list_interfaces()}, wanted);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, e.what());
        }
        auto id = self->state.next_probe++;
        auto rp = self->make_response_promise<std::vector<probe_result>>();
        self->state.probes.emplace(id, rp);
        auto hdl = caf::actor_cast<colocator_actor>(self);
        std::thread{[hdl, id, local = std::move(local), targets = std::move(targets)] {
          post_from(hdl, probed_atom::value, id,
                         probe_peers(local, targets, std::chrono::milliseconds(2000)));
        }}.detach();
        return rp;
      },
      [=](probed_atom, uint64_t id, std::vector<probe_result>& results) {
        if (!from_itself("a probe report"))
          return;
        auto it = self->state.probes.find(id);
        if (it == self->state.probes.end())
          return;
        it->second.deliver(std::move(results));
        self->state.probes.erase(it);
      },
      [=](port_atom) -> caf::result<int32_t> {
        if (!from_driver("a free port request"))
          return refused_error("free port");
        return self->state.refused.empty() ? find_free_port() : 0;
      },
      [=](gpu_atom, uint32_t count) -> caf::result<gpu_lease> {
        if (!from_driver("a device request"))
          return refused_error("devices");
        auto& n = settings_of(self->system());
        gpu_lease lease;
        if (!self->state.refused.empty()) {
          lease.why = self->state.refused;
          return lease;
        }
        lease.devices = n.gpus->lend(self->id(), count, lease.why);
        if (!lease.devices.empty()) {
          self->state.gpu_pool_held = n.gpus;
          self->state.gpu_owner = self->id();
          n.jobs->set_gpus(self->id(), lease.devices);
        }
        return lease;
      },
      [=](workers_atom, std::vector<uint32_t>& slots,
          uint32_t ending) -> caf::result<std::vector<worker_actor>> {
        if (!from_driver("a workers request"))
          return refused_error("workers");
        auto& st = self->state;
        if (!st.refused.empty())
          return std::vector<worker_actor>{};
        if (st.book) {
          std::string why;
          if (!take_slots(slots, why)) {
            // The job replaces its own ranks here (a plan replaced before its release, a
            // rank retired and asked for again): their workers give their slots back
            // once gone. That is waited for, up to a deadline, rather than refused.
            if (!st.book->fits_once_own_end(st.book_id, static_cast<uint32_t>(slots.size()),
                                            ending))
              return caf::make_error(caf::sec::runtime_error, cannot_start(slots.size(), why));
            auto id = st.next_handover++;
            auto rp = self->make_response_promise<std::vector<worker_actor>>();
            st.handovers.emplace(
                id, colocator_state::handover{std::move(slots), rp, std::chrono::steady_clock::now()});
            self->delayed_send(self, handover_wait, deadline_atom::value, id);
            return rp;
          }
        }
        return spawn_workers(slots);
      },
      [=](deadline_atom, uint64_t id) {
        if (!from_itself("a slot handover's deadline"))
          return;
        auto& st = self->state;
        auto it = st.handovers.find(id);
        if (it == st.handovers.end())
          return;
        auto h = std::move(it->second);
        st.handovers.erase(it);
        std::string why;
        if (take_slots(h.slots, why)) {
          h.rp.deliver(spawn_workers(h.slots));
          return;
        }
        auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - h.since);
        h.rp.deliver(caf::make_error(
            caf::sec::runtime_error,
            fmt::format("{} (waited {:.1f} s for this job's own ranks on the node to end and "
                        "give their slots back)",
                        cannot_start(h.slots.size(), why), waited.count())));
      },
      [=](launch_atom, launch_batch& batch) -> caf::result<std::vector<int32_t>> {
        if (!from_driver("a launch batch"))
          return refused_error("launch");
        auto& st = self->state;
        if (!st.refused.empty())
          return caf::make_error(caf::sec::runtime_error, st.refused);
        auto n = batch.slots.size();
        if (batch.envs.size() != n)
          return caf::make_error(caf::sec::invalid_argument, "launch batch: slots and envs differ");
        auto rp = self->make_response_promise<std::vector<int32_t>>();
        auto pids = std::make_shared<std::vector<int32_t>>(n, 0);
        auto left = std::make_shared<size_t>(n);
        if (n == 0) {
          rp.deliver(std::vector<int32_t>{});
          return rp;
        }
        auto done_one = [rp, pids, left]() mutable {
          if (--*left == 0)
            rp.deliver(std::move(*pids));
        };
        for (size_t i = 0; i < n; ++i) {
          auto it = st.by_slot.find(batch.slots[i]);
          if (it == st.by_slot.end()) {
            done_one();
            continue;
          }
          launch_spec spec;
          spec.argv = batch.argv;
          spec.cwd = batch.cwd;
          spec.env = batch.common_env;
          spec.env.insert(spec.env.end(), std::make_move_iterator(batch.envs[i].begin()),
                          std::make_move_iterator(batch.envs[i].end()));
          // The node-wide slot the rank holds, as NODE:INDEX (indices count from 0 over
          // every job on the node).
          if (auto ns = st.node_slot.find(batch.slots[i]); ns != st.node_slot.end())
            spec.env.push_back(fmt::format("CAF_HVD_SLOT={}:{}", settings_of(self->system()).name,
                                           ns->second));
          spec.executor = batch.executor;
          spec.boot = batch.boot;
          spec.max_frame = batch.max_frame;
          st.launching.insert(batch.slots[i]);
          self->request(it->second, std::chrono::seconds(60), launch_atom::value, std::move(spec))
              .then(
                  [self, slot = batch.slots[i], pids, i, done_one](int32_t pid) mutable {
                    self->state.launching.erase(slot);
                    (*pids)[i] = pid;
                    if (pid > 0 && self->state.by_slot.count(slot))
                      self->state.pids[slot] = pid;
                    done_one();
                  },
                  [self, slot = batch.slots[i], done_one](caf::error&) mutable {
                    self->state.launching.erase(slot);
                    done_one();
                  });
        }
        return rp;
      },
      // Reading /proc and taking sockets from other processes blocks: a thread does it.
      // A rank's process is caf-hvd-exec's group (the shim forks the command), so the
      // whole group is searched; the shim itself holds only pipes.
      [=](abort_atom, std::vector<uint32_t>& slots, std::vector<std::string>& gloo_text,
          std::vector<std::string>& keep_text) -> caf::result<gloo_abort_report> {
        if (!from_driver("a Gloo abort"))
          return refused_error("Gloo abort");
        auto& st = self->state;
        std::vector<pid_t> groups;
        for (auto slot : slots)
          if (auto it = st.pids.find(slot); it != st.pids.end())
            groups.push_back(it->second);
        std::set<tcp_endpoint> gloo, keep;
        for (auto& t : gloo_text)
          if (auto e = parse_endpoint(t))
            gloo.insert(*e);
        for (auto& t : keep_text)
          if (auto e = parse_endpoint(t))
            keep.insert(*e);
        if (groups.empty() || gloo.empty())
          return gloo_abort_report{};
        auto id = st.next_abort++;
        auto rp = self->make_response_promise<gloo_abort_report>();
        st.aborts.emplace(id, rp);
        auto hdl = caf::actor_cast<colocator_actor>(self);
        std::thread{[hdl, id, groups = std::move(groups), gloo = std::move(gloo),
                     keep = std::move(keep)] {
          auto r = abort_gloo_connections(groups, gloo, keep);
          post_from(hdl, aborted_atom::value, id,
                         gloo_abort_report{static_cast<uint32_t>(groups.size()), r.cut,
                                           std::move(r.problems), r.refused});
        }}.detach();
        return rp;
      },
      [=](aborted_atom, uint64_t id, gloo_abort_report& report) {
        if (!from_itself("an abort report"))
          return;
        auto it = self->state.aborts.find(id);
        if (it == self->state.aborts.end())
          return;
        it->second.deliver(std::move(report));
        self->state.aborts.erase(it);
      },
      [=](enlist_atom, worker_actor w) {
        // a worker of this node enlists itself
        if (!sent_by(self, w) || w->node() != self->node())
          return note_refused(self, "a colocator", "an enlist");
        enlist(self, std::move(w));
      },
      [=](call_atom, uint64_t id, uint32_t deadline_ms, std::string& payload,
          std::vector<uint32_t>& slots) {
        if (!from_driver("an executor call"))
          return;
        auto& st = self->state;
        for (size_t i = 0; i < slots.size(); ++i) {
          auto it = st.by_slot.find(slots[i]);
          if (it == st.by_slot.end())
            continue; // its worker is gone, and its exit report fails the call
          self->send(it->second, call_atom::value, id, deadline_ms,
                     i + 1 == slots.size() ? std::move(payload) : payload);
        }
      },
      [=](terminate_atom, int32_t grace) {
        if (!from_driver("a terminate"))
          return;
        for (auto& w : self->state.workers)
          self->send(w, terminate_atom::value, int32_t{SIGTERM});
        self->delayed_send(self, std::chrono::milliseconds(grace), kill_atom::value);
      },
      // The agent shuts down: its ranks stop as the driver would stop them, and their
      // exits say who stopped them.
      [=](stop_atom, const std::string& why) {
        if (!from_agent("a stop"))
          return;
        auto& st = self->state;
        st.stopping = true;
        if (st.workers.empty())
          return self->quit(caf::exit_reason::user_shutdown);
        for (auto& w : st.workers)
          self->send(w, stop_atom::value, why);
        self->delayed_send(self, std::chrono::milliseconds(grace_ms), kill_atom::value);
      },
      [=](cancel_atom, const std::string& which, const std::string& only, const std::string& by) {
        if (!from_agent("a cancel") || which != job || !self->state.refused.empty()
            || (!only.empty() && only != owner))
          return; // another job, or another owner's job of the same id
        auto& st = self->state;
        std::fprintf(stderr, "caf-hvd node '%s': job %s cancelled by %s; stopping its %zu ranks\n",
                     settings_of(self->system()).name.c_str(), printable(job).c_str(),
                     printable(by).c_str(), st.workers.size());
        self->send(st.driver, cancel_atom::value, settings_of(self->system()).name, by);
        // Its ranks stop whether or not the driver answers (it may be stopped itself).
        for (auto& w : st.workers)
          self->send(w, terminate_atom::value, int32_t{SIGTERM});
        self->delayed_send(self, std::chrono::milliseconds(grace_ms), kill_atom::value);
      },
      [=](drain_atom, bool on, std::string& how) {
        if (!from_agent("a drain notice"))
          return;
        if (self->state.refused.empty())
          self->send(self->state.driver, drain_atom::value, settings_of(self->system()).name, on,
                     std::move(how));
      },
      [=](kill_atom) {
        if (!from_itself("a kill"))
          return;
        if (!self->state.refused.empty())
          return self->quit(caf::exit_reason::user_shutdown);
        for (auto& w : self->state.workers)
          self->send(w, terminate_atom::value, int32_t{SIGKILL});
        if (self->state.driver_gone && self->state.workers.empty())
          self->quit(caf::exit_reason::user_shutdown);
      },
  };
}

} // namespace cafhvd
