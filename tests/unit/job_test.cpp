// The job actor on CAF's deterministic test scheduler (one thread, virtual time), with
// fake node actors behind the factory names a node agent spawns by: no processes. The
// fakes record what the job asks of them; the test plays the ranks' exits.
#include <doctest/doctest.h>

#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <caf/scheduler/test_coordinator.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "actors/driver.hpp"
#include "actors/protocol.hpp"
#include "runtime/launch/channel.hpp"

using namespace cafhvd;

namespace {

// What the fake node saw; one per test (the fakes are spawned by name, without it).
struct node_log {
  std::map<uint32_t, worker_actor> workers; // slot id -> its worker
  std::map<uint32_t, worker_actor> spawned; // every worker ever spawned (not erased)
  std::map<uint32_t, std::vector<std::string>> envs;
  std::map<uint32_t, launch_spec> specs;                                   // executor mode
  std::map<uint32_t, std::vector<std::pair<uint64_t, std::string>>> calls; // slot -> calls
  std::map<uint32_t, int> closes;                                          // slot -> chclose
  std::map<uint32_t, std::vector<int32_t>> signals;
  int terminates = 0;             // teardowns asked of the colocator
  int batches = 0;                // launch messages the colocator got
  bool answer_node_info = true;   // false: a node agent that never answers
  bool ignore_sigterm = false;    // the ranks trap SIGTERM (only SIGKILL ends them)
  std::vector<std::string> names; // node names for the colocators, in spawn order
  int32_t gpus = 0;               // devices every fake node has
  int32_t gpus_taken = 0;         // ... of which other jobs hold the first N
  std::map<std::string, std::vector<int32_t>> lent; // node -> devices lent to the job
  size_t next_name = 0;
  std::map<uint32_t, std::string> worker_host;  // slot id -> its colocator's node
  std::map<std::string, std::string> report_as; // node -> the host its workers report
  bool silent_workers = false;                  // workers never report their host
  std::set<std::string> silent_hosts;           // ... on these nodes (the test reports)
  std::map<uint32_t, int32_t> exit_at_launch;   // slot id -> the code its process ends with
                                                // at once (reported before the launch reply)
  std::map<std::string, colocator_actor> colocators; // node -> its colocator
  std::map<uint32_t, uint32_t> idle_ms; // slot id -> ms since its last sign of life (0)
};
node_log* the_log = nullptr;

colocator_actor::behavior_type fake_colocator(colocator_actor::pointer self, driver_actor driver,
                                              coordinator_actor coordinator, std::string,
                                              int32_t grace_ms, signed_ticket) {
  std::string name = the_log->next_name < the_log->names.size()
                         ? the_log->names[the_log->next_name++]
                         : std::string{"fake"};
  the_log->colocators[name] = caf::actor_cast<colocator_actor>(self);
  return {
      [=](node_atom) -> caf::result<node_info> {
        if (!the_log->answer_node_info)
          return self->make_response_promise<node_info>(); // never delivered
        std::vector<int32_t> gpus(the_log->gpus);
        for (int32_t i = 0; i < the_log->gpus; ++i)
          gpus[static_cast<size_t>(i)] = i;
        auto free_gpus = gpus;
        free_gpus.erase(free_gpus.begin(),
                        free_gpus.begin() + std::min<int32_t>(the_log->gpus_taken, the_log->gpus));
        return node_info{name, name, 1,         0,       {{"lo", "127.0.0.1", 8, true}},
                         0,    gpus, free_gpus, "--gpus"};
      },
      [](port_atom) -> int32_t { return 4242; },
      [](probe_atom, std::vector<probe_target>&,
         std::vector<std::string>&) -> std::vector<probe_result> { return {}; },
      [](probed_atom, uint64_t, std::vector<probe_result>&) {},
      [](enlist_atom, worker_actor) {},
      [=](call_atom, uint64_t id, uint32_t deadline, std::string& payload,
          std::vector<uint32_t>& slots) {
        for (auto slot : slots)
          if (auto it = the_log->workers.find(slot); it != the_log->workers.end())
            self->send(it->second, call_atom::value, id, deadline, payload);
      },
      [=](workers_atom, std::vector<uint32_t>& slots, uint32_t) -> std::vector<worker_actor> {
        std::vector<worker_actor> out;
        auto me = caf::actor_cast<colocator_actor>(self);
        for (auto id : slots) {
          the_log->worker_host[id] = name;
          auto w = self->system().spawn<worker_actor>(
              worker_type_name, caf::make_message(me, driver, coordinator, id));
          out.push_back(w ? *w : worker_actor{});
        }
        return out;
      },
      [=](launch_atom, launch_batch& b) -> caf::result<std::vector<int32_t>> {
        ++the_log->batches;
        auto rp = self->make_response_promise<std::vector<int32_t>>();
        auto pids = std::make_shared<std::vector<int32_t>>(b.slots.size(), 0);
        auto left = std::make_shared<size_t>(b.slots.size());
        for (size_t i = 0; i < b.slots.size(); ++i) {
          launch_spec spec;
          spec.argv = b.argv;
          spec.cwd = b.cwd;
          spec.env = b.common_env;
          spec.env.insert(spec.env.end(), b.envs[i].begin(), b.envs[i].end());
          spec.executor = b.executor;
          spec.boot = b.boot;
          spec.max_frame = b.max_frame;
          self->request(the_log->workers.at(b.slots[i]), caf::infinite, launch_atom::value, spec)
              .then([=](int32_t pid) mutable {
                (*pids)[i] = pid;
                if (--*left == 0)
                  rp.deliver(*pids);
              });
        }
        return rp;
      },
      [=](gpu_atom, uint32_t n) -> gpu_lease {
        std::vector<int32_t> held;
        for (int32_t i = the_log->gpus_taken; i < the_log->gpus && held.size() < n; ++i)
          held.push_back(i);
        if (held.size() < n)
          return {{}, "too few"};
        the_log->lent[name] = held;
        return {held, {}};
      },
      [=](terminate_atom, int32_t) {
        ++the_log->terminates;
        for (auto& [id, w] : the_log->workers)
          self->send(w, terminate_atom::value, int32_t{SIGTERM});
        self->delayed_send(self, std::chrono::milliseconds(grace_ms), kill_atom::value);
      },
      [](stop_atom, std::string&) {},
      // as the real one: tell the driver
      [=](cancel_atom, std::string&, std::string&, std::string& by) {
        self->send(driver, cancel_atom::value, name, by);
      },
      [=](drain_atom, bool on, std::string& how) { // as the real one: tell the driver
        self->send(driver, drain_atom::value, name, on, how);
      },
      [](abort_atom, std::vector<uint32_t>&, std::vector<std::string>&, std::vector<std::string>&) {
        return gloo_abort_report{};
      },
      [](aborted_atom, uint64_t, gloo_abort_report&) {},
      [](deadline_atom, uint64_t) {},
      [=](kill_atom) {
        for (auto& [id, w] : the_log->workers)
          self->send(w, terminate_atom::value, int32_t{SIGKILL});
      },
  };
}

// A rank's process that ends the moment it is signalled (unless it traps SIGTERM).
worker_actor::behavior_type fake_worker(worker_actor::pointer self, colocator_actor,
                                        driver_actor driver, coordinator_actor coordinator,
                                        uint32_t id) {
  the_log->workers[id] = caf::actor_cast<worker_actor>(self);
  the_log->spawned[id] = caf::actor_cast<worker_actor>(self);
  // registration: the host it runs on (a test may make it lie)
  auto host = the_log->worker_host[id];
  if (auto it = the_log->report_as.find(host); it != the_log->report_as.end())
    host = it->second;
  if (!the_log->silent_workers && !the_log->silent_hosts.count(the_log->worker_host[id]))
    self->send(coordinator, report_atom::value, id, host);
  return {
      [=](launch_atom, launch_spec& spec) -> int32_t {
        the_log->envs[id] = spec.env;
        the_log->specs[id] = spec;
        if (auto it = the_log->exit_at_launch.find(id); it != the_log->exit_at_launch.end()) {
          self->send(driver, exited_atom::value, rank_exit{id, "fake", it->second, 0, {}, {}});
          the_log->workers.erase(id);
        }
        return static_cast<int32_t>(1000 + id);
      },
      [=](terminate_atom, int32_t sig) {
        the_log->signals[id].push_back(sig);
        if (sig == SIGTERM && the_log->ignore_sigterm)
          return;
        self->send(driver, exited_atom::value, rank_exit{id, "fake", 0, sig, {}, {}});
        the_log->workers.erase(id);
        self->quit();
      },
      [](stop_atom, std::string&) {},
      [](output_atom, output_batch&) {},
      [](exited_atom, rank_exit&) {},
      [=](call_atom, uint64_t call, uint32_t, std::string& payload) {
        the_log->calls[id].emplace_back(call, payload);
      },
      [=](close_atom) { ++the_log->closes[id]; },
      [](result_atom, uint64_t, std::string&) {},
      [](log_atom, std::string&) {},
      [](chanend_atom, std::string&) {},
      [=](alive_atom) {
        auto it = the_log->idle_ms.find(id);
        return it == the_log->idle_ms.end() ? uint32_t{0} : it->second;
      },
      [](deadline_atom, uint64_t) {},
  };
}

struct fake_node_config : hvd_config {
  fake_node_config() {
    set("scheduler.policy", caf::atom("testing"));
    actor_factories.erase(colocator_type_name);
    actor_factories.erase(worker_type_name);
    add_actor_type(colocator_type_name, fake_colocator);
    add_actor_type(worker_type_name, fake_worker);
  }
};

struct fixture {
  node_log log;
  fake_node_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<job_result> result = std::make_shared<job_result>();
  driver_full_actor job;
  bool ended = false;

  fixture() { the_log = &log; }
  ~fixture() {
    the_log = nullptr;
    if (!events_path.empty())
      ::unlink(events_path.c_str());
  }

  void start(int np, std::chrono::milliseconds grace = std::chrono::milliseconds(5000),
             std::function<void(job_config&)> tweak = {}) {
    job_config c;
    c.embedded = true;
    c.np = np;
    c.hosts = {host_spec{"localhost", 0, static_cast<uint32_t>(np)}};
    c.command = {"train"};
    c.cwd = "/";
    c.kill_grace = grace;
    c.torch_store = torch_store_mode::off;
    if (tweak)
      tweak(c);
    job = spawn_driver(sys, c, result);
    sched.run();
  }

  // An elastic job whose discovery results and votes the test sends (no script, no
  // rendezvous client): its events are read back from the event log.
  std::string events_path;
  void start_elastic(std::vector<std::string> names, std::chrono::milliseconds grace,
                     std::function<void(job_config&)> tweak = {}) {
    log.names = std::move(names);
    events_path = fmt::format("/tmp/caf-hvd-job-test-{}.jsonl", ::getpid());
    job_config c;
    c.embedded = true;
    c.command = {"train"};
    c.cwd = "/";
    c.kill_grace = grace;
    c.torch_store = torch_store_mode::off;
    c.events_file = events_path;
    c.elastic = elastic_config{};
    c.elastic->min_np = 1;
    if (tweak)
      tweak(c);
    job = spawn_driver(sys, c, result);
    sched.run();
  }
  // Stops a job that would run on (Ctrl-C), through every grace period.
  void interrupt() {
    caf::send_as(job, job, interrupt_atom::value, int32_t{SIGINT}); // from its signal thread
    sched.run();
    for (int i = 0; i < 10 && !job_ended(); ++i) {
      sched.trigger_timeouts();
      sched.run();
    }
    CHECK(job_ended());
  }
  void discover(const std::string& text) {
    auto j = caf::actor_cast<caf::actor>(job);
    caf::send_as(j, j, discover_atom::value, true, text); // from its discovery thread
    sched.run();
  }
  // A rank's GET /rank_and_size/<host>:<lr>, as the rendezvous server hands it to the
  // job's coordinator.
  void vote(const std::string& host, int lr) {
    caf::send_as(coordinator(), coordinator(), vote_atom::value, host, int32_t{lr});
    sched.run();
  }
  coordinator_full_actor coordinator() {
    caf::scoped_actor self{sys};
    auto h = self->request(caf::actor_cast<caf::actor>(job), caf::infinite, caf::get_atom::value);
    sched.run();
    coordinator_full_actor out;
    h.receive([&](coordinator_full_actor c) { out = c; }, [](caf::error&) {});
    REQUIRE(out);
    return out;
  }
  std::vector<nlohmann::json> events() {
    std::ifstream in{events_path};
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line));
    return out;
  }
  std::vector<std::string> names_of(const std::string& prefix) {
    std::vector<std::string> out;
    for (auto& e : events())
      if (e["name"].get<std::string>().rfind(prefix, 0) == 0)
        out.push_back(e["name"].get<std::string>() + ":"
                      + e["context"].value("generation", nlohmann::json(0)).dump());
    return out;
  }
  // The slot id of the newest process started with HOROVOD_HOSTNAME=host and local rank lr.
  uint32_t slot_on(const std::string& host, int lr) {
    uint32_t found = 0;
    bool any = false;
    for (auto& [id, env] : log.envs) {
      bool h = std::count(env.begin(), env.end(), "HOROVOD_HOSTNAME=" + host) > 0;
      bool l = std::count(env.begin(), env.end(), "HOROVOD_LOCAL_RANK=" + std::to_string(lr)) > 0;
      if (h && l && (!any || id > found)) {
        found = id;
        any = true;
      }
    }
    REQUIRE(any);
    return found;
  }

  // The slot id whose process got HOROVOD_RANK=r.
  uint32_t slot_of_rank(int r) {
    for (auto& [id, env] : log.envs)
      for (auto& kv : env)
        if (kv == "HOROVOD_RANK=" + std::to_string(r))
          return id;
    FAIL("no process of rank " << r);
    return 0;
  }

  // The node's colocator tells the job it drains (on) or is back (off), as `caf-hvd
  // drain` makes it.
  void drain(const std::string& node, bool on) {
    caf::anon_send(log.colocators.at(node), drain_atom::value, on,
                   std::string{"drained by the cluster's administrator 'root'"});
    sched.run();
  }

  void exit(uint32_t id, int32_t code, std::string stopped_by = {}) {
    caf::send_as(log.spawned.at(id), job, exited_atom::value,
                 rank_exit{id, "fake", code, 0, {}, std::move(stopped_by)});
    log.workers.erase(id);
    sched.run();
  }

  bool job_ended() {
    caf::scoped_actor self{sys};
    self->monitor(job);
    sched.run();
    bool down = false;
    self->receive([&](caf::down_msg&) { down = true; },
                  caf::after(std::chrono::seconds(0)) >> [] {});
    return down;
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "the job takes a rank's exit, output and results only from that "
                           "rank's worker, and its own signals only from itself") {
  start(2);
  caf::scoped_actor stranger{sys}; // any actor of a connected peer, or a forged anonymous one
  auto s0 = slot_of_rank(0), s1 = slot_of_rank(1);
  // another rank's worker, a stranger and an anonymous sender cannot end rank 0 or the job
  caf::send_as(log.spawned.at(s1), job, exited_atom::value, rank_exit{s0, "fake", 3, 0, {}, {}});
  stranger->send(job, exited_atom::value, rank_exit{s0, "fake", 3, 0, {}, {}});
  caf::anon_send(job, exited_atom::value, rank_exit{s0, "fake", 3, 0, {}, {}});
  caf::anon_send(job, interrupt_atom::value, int32_t{SIGINT});
  stranger->send(job, interrupt_atom::value, int32_t{SIGTERM});
  sched.run();
  CHECK_FALSE(job_ended());
  CHECK(log.terminates == 0);
  CHECK(log.signals.empty());
  // a forged output batch is answered with a refusal, not printed
  stranger->send(job, output_atom::value, output_batch{s0, 0, {"forged line"}});
  sched.run();
  std::string answer = "none";
  stranger->receive([&](caf::ok_atom) { answer = "ok"; },
                    [&](caf::error& e) { answer = sys.render(e); },
                    caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(answer.find("refused") != std::string::npos);
  // the ranks' own exits end the job as before
  exit(s0, 0);
  exit(s1, 0);
  CHECK(job_ended());
  CHECK(result->exit_code == 0);
}

TEST_CASE_FIXTURE(fixture,
                  "static job: every rank launched with its place; all exit 0, job exits 0") {
  start(3);
  REQUIRE(log.envs.size() == 3);
  for (int r = 0; r < 3; ++r) {
    auto& env = log.envs[slot_of_rank(r)];
    CHECK(std::count(env.begin(), env.end(), "HOROVOD_SIZE=3") == 1);
    CHECK(std::count(env.begin(), env.end(), "HOROVOD_LOCAL_RANK=" + std::to_string(r)) == 1);
    CHECK(std::count(env.begin(), env.end(), "MASTER_PORT=4242") == 1); // --torch-store off
    CHECK(std::count(env.begin(), env.end(), "HOROVOD_ELASTIC=1") == 0);
    CHECK(std::count(env.begin(), env.end(), "HOROVOD_RANK=" + std::to_string(r)) == 1);
  }
  CHECK(log.batches == 1); // one launch message for the node's three ranks
  for (int r = 0; r < 3; ++r)
    exit(slot_of_rank(r), 0);
  CHECK(job_ended());
  CHECK(result->exit_code == 0);
  CHECK(log.terminates == 0);
}

TEST_CASE_FIXTURE(fixture,
                  "static job fails fast: the first failure stops the rest, its code wins") {
  start(3);
  exit(slot_of_rank(1), 3);
  CHECK(log.terminates == 1); // SIGTERM to the others at once
  CHECK(log.signals[slot_of_rank(0)] == std::vector<int32_t>{SIGTERM});
  CHECK(job_ended());
  CHECK(result->exit_code == 3); // not the SIGTERMed ranks' 143
}

TEST_CASE_FIXTURE(fixture, "static job: an exit reported before its launch reply is taken "
                           "after it: the rank starts, the run phase begins, then it ends") {
  events_path = fmt::format("/tmp/caf-hvd-job-test-{}.jsonl", ::getpid());
  // slot ids are given in plan order from 0; rank 1's process ends with code 6 at once
  log.exit_at_launch[1] = 6;
  start(2, std::chrono::milliseconds(5000), [&](job_config& c) { c.events_file = events_path; });
  CHECK(job_ended());
  CHECK(result->exit_code == 6);
  std::vector<std::string> seen;
  for (auto& e : events()) {
    auto name = e["name"].get<std::string>();
    if (name == "rank.started" || name == "rank.ended")
      seen.push_back(fmt::format("{} {}", name, e["context"]["rank"].get<int>()));
    else if (name == "phase.begin")
      seen.push_back("phase " + e["context"]["phase"].get<std::string>());
  }
  INFO(fmt::format("{}", fmt::join(seen, ", ")));
  CHECK(seen
        == std::vector<std::string>{"phase connect", "phase nic", "phase launch", "rank.started 0",
                                    "rank.started 1", "phase run", "rank.ended 1", "phase teardown",
                                    "rank.ended 0"});
}

TEST_CASE_FIXTURE(fixture, "static teardown escalates to SIGKILL for ranks that trap SIGTERM") {
  log.ignore_sigterm = true;
  start(2, std::chrono::milliseconds(1000));
  auto r0 = slot_of_rank(0);
  exit(slot_of_rank(1), 5);
  CHECK(log.signals[r0] == std::vector<int32_t>{SIGTERM});
  CHECK_FALSE(job_ended());
  sched.trigger_timeout(); // the grace period passes (the earliest timeout)
  sched.run();
  CHECK(log.signals[r0] == std::vector<int32_t>{SIGTERM, SIGKILL});
  CHECK(job_ended());
  CHECK(result->exit_code == 5);
}

TEST_CASE_FIXTURE(fixture, "static start has one deadline that names what it waited for") {
  log.answer_node_info = false;
  start(2);
  CHECK(log.envs.empty());
  CHECK_FALSE(job_ended());
  sched.trigger_timeouts(); // --start-timeout passes (virtual time)
  sched.run();
  CHECK(job_ended());
  CHECK(result->exit_code == 1);
}

namespace {

std::string env_value(const std::vector<std::string>& env, const std::string& key) {
  for (auto& kv : env)
    if (kv.rfind(key + "=", 0) == 0)
      return kv.substr(key.size() + 1);
  return "<unset>";
}

} // namespace

TEST_CASE_FIXTURE(fixture, "elastic: generation 1 starts released; a later plan is released by "
                           "the last vote of the ranks it carries over, and its fresh slots "
                           "start then, with that plan") {
  start_elastic({"a", "b", "c", "d"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  REQUIRE(log.envs.size() == 2);
  CHECK(names_of("generation.")
        == std::vector<std::string>{"generation.begin:1", "generation.released:1"});
  CHECK(env_value(log.envs[slot_on("a", 0)], "HOROVOD_SIZE") == "2");
  discover("a:1:1\nb:2:1\nc:3:1\n"); // c joins: generation 2 forms
  CHECK(log.envs.size() == 2);       // c's process waits for the release
  vote("a", 0);
  discover("a:1:1\nb:2:1\nc:3:1\nd:4:1\n"); // d too, before generation 2 was released
  vote("b", 0);
  CHECK(names_of("generation.")
        == std::vector<std::string>{"generation.begin:1", "generation.released:1",
                                    "generation.begin:2", "generation.begin:3",
                                    "generation.released:3"});
  REQUIRE(log.envs.size() == 4);
  // The fresh processes got the released plan; none was ever started with generation 2's.
  for (auto* h : {"c", "d"}) {
    auto& env = log.envs[slot_on(h, 0)];
    CHECK(env_value(env, "HOROVOD_SIZE") == "4");
    CHECK(env_value(env, "HOROVOD_CROSS_SIZE") == "4");
  }
  CHECK(env_value(log.envs[slot_on("c", 0)], "HOROVOD_RANK") == "2");
  CHECK(env_value(log.envs[slot_on("d", 0)], "HOROVOD_RANK") == "3");
  interrupt();
  CHECK(result->exit_code == 130);
}

TEST_CASE_FIXTURE(fixture, "elastic: a new host that discovery lists before the survivors "
                           "comes after them: the survivors keep the low ranks (rank 0 holds "
                           "the committed state)") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  REQUIRE(log.envs.size() == 2);
  CHECK(env_value(log.envs[slot_on("a", 0)], "HOROVOD_RANK") == "0");
  // c comes first in discovery's answer (a script may list hosts in any order)
  discover("c:3:1\na:1:1\nb:2:1\n");
  vote("a", 0);
  vote("b", 0);
  CHECK(names_of("generation.released").size() == 2);
  REQUIRE(log.envs.size() == 3);
  auto& fresh = log.envs[slot_on("c", 0)];
  CHECK(env_value(fresh, "HOROVOD_SIZE") == "3");
  // a, which held rank 0 (and so the state every rank restores from), is still rank 0:
  // the newcomer is rank 2, not rank 0
  CHECK(env_value(fresh, "HOROVOD_RANK") == "2");
  CHECK(env_value(fresh, "HOROVOD_CROSS_RANK") == "2");
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a plan waits for every rank it carries over, not for one") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:2\nb:2:1\n");
  discover("a:1:2\nb:2:1\nc:3:1\n");
  vote("a", 0);
  vote("a", 1);
  CHECK(names_of("generation.released").size() == 1); // b's rank is still in its step
  CHECK(log.envs.size() == 3);
  vote("b", 0);
  CHECK(names_of("generation.released").size() == 2);
  CHECK(log.envs.size() == 4);
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a rank that holds state and misses the elastic timeout "
                           "is waited for while its worker sees it alive, and fails once it "
                           "shows no sign of life for that long") {
  start_elastic({"a", "b", "c", "d"}, std::chrono::milliseconds(1000), [](job_config& c) {
    c.elastic->elastic_timeout = std::chrono::milliseconds(30);
  });
  discover("a:1:1\nb:2:1\n");
  auto b0 = slot_on("b", 0);
  discover("a:1:1\nb:2:1\nc:3:1\n"); // generation 2 forms: a and b re-join at their commit
  vote("a", 0);
  log.idle_ms[b0] = 0; // b's rank is in a long step: its process uses CPU time
  for (int i = 0; i < 3; ++i) { // three elastic timeouts pass, b alive at each
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    sched.trigger_timeouts();
    sched.run();
  }
  CHECK(names_of("host.blacklisted").empty());
  CHECK(names_of("rank.slow") == std::vector<std::string>{"rank.slow:2"}); // said once
  CHECK(names_of("generation.released").size() == 1);
  vote("b", 0); // its step ended: it re-joins, and the plan runs
  CHECK(names_of("generation.released").size() == 2);
  CHECK(names_of("host.blacklisted").empty());
  // generation 3 (d joins); b's rank now blocks: no CPU time, no output for longer than
  // the elastic timeout
  discover("a:1:1\nb:2:1\nc:3:1\nd:4:1\n");
  vote("a", 0);
  vote("c", 0);
  log.idle_ms[b0] = 45;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  sched.trigger_timeouts();
  sched.run();
  auto bl = names_of("host.blacklisted");
  REQUIRE(bl.size() == 1);
  std::string cause;
  for (auto& e : events())
    if (e["name"] == "failure")
      cause = e["context"]["cause"].get<std::string>();
  CHECK(cause == "rank 1 (b:0) did not join generation 3 within 0.03 s (--elastic-timeout; it "
                 "holds the state of generation 2 and was waited for while it ran): it showed "
                 "no sign of life (no CPU time used, no output) for 0.045 s");
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a job whose first plan's ranks never started loses no "
                           "state when that plan's hosts go: it starts afresh elsewhere") {
  log.silent_hosts = {"a"}; // a's workers never report: its ranks are never launched
  start_elastic({"a", "b"}, std::chrono::milliseconds(1000));
  discover("a:1:2\n");
  CHECK(names_of("generation.begin").size() == 1);
  CHECK(log.envs.empty()); // nothing started
  discover("b:2:2\n"); // a is gone from the cluster's answer (its slots went to another job)
  CHECK_FALSE(job_ended());
  CHECK(names_of("generation.begin").size() == 2);
  CHECK(log.envs.size() == 2); // b's two ranks run
  CHECK(env_value(log.envs[slot_on("b", 0)], "HOROVOD_SIZE") == "2");
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a rank its node agent stopped as it shut down is no "
                           "failure: the node leaves until listed again, not blacklisted") {
  start_elastic({"a", "b"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  REQUIRE(log.envs.size() == 2);
  exit(slot_on("b", 0), 143, "node agent 'b' received Terminated");
  CHECK_FALSE(job_ended());
  CHECK(names_of("host.blacklisted").empty());
  CHECK(names_of("generation.begin").size() == 2); // a alone
  vote("a", 0);
  discover("a:1:1\nb:2:1\n"); // b's agent is back and listed: the job grows onto it again
  vote("a", 0);
  CHECK(names_of("generation.begin").size() == 3);
  CHECK(names_of("host.blacklisted").empty());
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: fresh slots of a plan that is never released are dropped "
                           "when the job ends, without a process") {
  start_elastic({"a", "b"}, std::chrono::milliseconds(1000));
  discover("a:1:1\n");
  discover("a:1:1\nb:2:1\n"); // b's slot waits for a release that a's end prevents
  exit(slot_on("a", 0), 0);   // a's rank finished the training
  CHECK(job_ended());
  CHECK(result->exit_code == 0);
  CHECK(log.envs.size() == 1);
  CHECK(names_of("host.lost").empty()); // dropping b's worker is not news of b's node
}

TEST_CASE_FIXTURE(fixture, "elastic: a rank 0 that ends before its released peers on another "
                           "host launched leaves them to run; the job ends when they do") {
  log.silent_hosts = {"b"}; // b's worker is slow to report: its rank launches later
  start_elastic({"a", "b"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  REQUIRE(log.envs.size() == 1); // a's rank runs, b's waits for its worker
  auto coord = coordinator();
  exit(slot_on("a", 0), 0); // and ends at once (a short program)
  CHECK_FALSE(job_ended());
  uint32_t b = 0;
  for (auto& [id, node] : log.worker_host)
    if (node == "b")
      b = id;
  caf::send_as(log.spawned.at(b), coord, report_atom::value, b, std::string{"b"}); // its worker
  sched.run();
  REQUIRE(log.envs.count(b) == 1); // launched, with the released plan
  CHECK(env_value(log.envs[b], "HOROVOD_SIZE") == "2");
  CHECK_FALSE(job_ended());
  exit(b, 0);
  CHECK(job_ended());
  CHECK(result->exit_code == 0);
  CHECK(names_of("host.lost").empty());
}

TEST_CASE_FIXTURE(fixture, "elastic: a fresh slot whose host leaves before the release is "
                           "dropped, and its host is not taken for lost") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\n");
  discover("a:1:1\nb:2:1\n"); // generation 2: b's slot waits for the release
  discover("a:1:1\nc:3:1\n"); // b leaves before it, c comes: generation 3 is a and c
  vote("a", 0);               // (the plan of a alone was superseded before it came)
  CHECK(names_of("generation.released")
        == std::vector<std::string>{"generation.released:1", "generation.released:3"});
  CHECK(names_of("host.lost").empty());
  REQUIRE(log.envs.size() == 2); // a's, then c's with generation 3's plan; b never ran
  CHECK(env_value(log.envs[slot_on("c", 0)], "HOROVOD_SIZE") == "2");
  interrupt();
}

TEST_CASE_FIXTURE(fixture,
                  "elastic: the state dies with the last rank of the released generation") {
  start_elastic({"a", "b"}, std::chrono::milliseconds(1000));
  discover("a:1:1\n");
  discover("a:1:1\nb:2:1\n"); // b joins: generation 2 forms, b's rank waits for its release
  CHECK(names_of("generation.")
        == std::vector<std::string>{"generation.begin:1", "generation.released:1",
                                    "generation.begin:2"});
  exit(slot_on("a", 0), 9); // a's rank dies in its step, before it re-joined
  CHECK(job_ended());
  CHECK(result->exit_code == 1);
  auto ev = events();
  CHECK(ev.back()["name"] == "job.end");
  CHECK(ev.back()["context"]["cause"].get<std::string>().find(
            "the training state was lost with the last host of the previous generation (a)")
        != std::string::npos);
  // b never held state: no generation 3 was started on it, and no process of b ever ran
  CHECK(names_of("generation.begin").size() == 2);
  CHECK(log.envs.size() == 1);
}

TEST_CASE_FIXTURE(fixture, "elastic: a slot that leaves and traps SIGTERM gets SIGKILL") {
  log.ignore_sigterm = true;
  start_elastic({"a"}, std::chrono::milliseconds(1000));
  discover("a:1:2\n");
  auto leaving = slot_on("a", 1);
  discover("a:1:1\n");                 // a shrinks: slot a:1 leaves the job
  CHECK(log.signals[leaving].empty()); // it may end by itself first
  sched.trigger_timeouts();            // the grace period
  sched.run();
  CHECK(log.signals[leaving] == std::vector<int32_t>{SIGTERM});
  sched.trigger_timeouts(); // another grace period
  sched.run();
  CHECK(log.signals[leaving] == std::vector<int32_t>{SIGTERM, SIGKILL});
  log.ignore_sigterm = false;
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: --reset-limit counts resets done, not plans formed") {
  // Horovod counts completed barriers: ElasticDriver's reset_count grows in
  // horovod/runner/elastic/registration.py (_action: `self._reset_count += 1` before
  // `self._driver.resume()`), and a plan that never ran is no reset.
  start_elastic({"a", "b", "c", "d"}, std::chrono::milliseconds(1000),
                [](job_config& c) { c.elastic->reset_limit = 1; });
  discover("a:1:1\n");
  discover("a:1:1\nb:2:1\n");        // plan 2 forms
  discover("a:1:1\nb:2:1\nc:3:1\n"); // plan 3 replaces it before its release
  vote("a", 0);                      // the first reset is done
  CHECK(names_of("generation.released")
        == std::vector<std::string>{"generation.released:1", "generation.released:3"});
  CHECK_FALSE(job_ended());
  discover("a:1:1\nb:2:1\nc:3:1\nd:4:1\n"); // a second reset: over the limit
  CHECK(job_ended());
  CHECK(result->exit_code == 1);
  auto ev = events();
  CHECK(ev.back()["context"]["cause"].get<std::string>().find(
            "the job has been reset 1 times, which reaches the reset limit (--reset-limit 1)")
        != std::string::npos);
}

namespace {
// The change each generation's notice tells rank 0 (notify.change events).
std::map<int, std::string> notices(const std::vector<nlohmann::json>& ev) {
  std::map<int, std::string> out;
  for (auto& e : ev)
    if (e["name"] == "notify.change")
      out[e["context"]["generation"].get<int>()] = e["context"]["change"].get<std::string>();
  return out;
}
} // namespace

TEST_CASE_FIXTURE(fixture, "elastic: a notice describes the change against the plan the ranks "
                           "run, and never says 'removed' alone") {
  // Horovod raises HostsUpdatedInterrupt(skip_sync = all_update == removed)
  // (horovod/common/elastic.py, State.check_host_updates), and run_fn then skips
  // state.sync() on every carried rank while a fresh rank broadcasts in it: a notice of
  // "removed" for a plan with fresh slots hangs the job.
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  discover("a:1:1\nb:2:1\nc:3:1\n"); // plan 2: c added
  discover("a:1:1\nc:3:1\n");        // plan 3: against plan 2 only b left
  auto n = notices(events());
  CHECK(n[2] == "added");
  CHECK(n[3] == "mixed"); // against generation 1 (a, b): b removed, c added
  vote("a", 0);
  CHECK(names_of("generation.released").size() == 2);
  discover("a:1:1\n"); // plan 4: c leaves; a alone, nothing fresh
  // not "removed" either: a plan with fresh slots may replace it before the ranks act on
  // its notice (then they would skip the sync the newcomers wait in)
  CHECK(notices(events())[4] == "mixed");
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a host removed from discovery keeps its rank until the "
                           "others re-joined; it is stopped after the release, not mid-step") {
  // Horovod retires a removed host's workers through rank_and_size (-1) after they
  // re-joined at a commit (horovod/runner/elastic/driver.py get_slot_info; the notice is
  // rank 0's, registration.py/_notify_workers_host_changes), so nothing since the last
  // commit is lost, even for rank 0's own host.
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\nc:3:1\n");
  auto a0 = slot_on("a", 0);
  discover("b:2:1\nc:3:1\n");                          // rank 0's host leaves
  CHECK(notices(events())[2] == "mixed");              // a removal is never told alone
  sched.advance_time(std::chrono::milliseconds(5000)); // far past the kill grace
  sched.run();
  CHECK(log.signals[a0].empty()); // still at work until it re-joins
  vote("b", 0);
  vote("c", 0);
  CHECK(names_of("generation.released").size() == 2);
  CHECK(log.signals[a0].empty());
  sched.advance_time(std::chrono::milliseconds(1100)); // the grace after the release
  sched.run();
  CHECK(log.signals[a0] == std::vector<int32_t>{SIGTERM});
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a node that drains is left at the next commit as a host gone "
                           "from discovery, not blamed; only its own colocator speaks for it") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\nc:3:1\n");
  auto c0 = slot_on("c", 0);
  // a peer that names c but is not c's colocator changes nothing
  caf::anon_send(caf::actor_cast<caf::actor>(job), drain_atom::value, std::string{"c"}, true,
                 std::string{"forged"});
  sched.run();
  CHECK(names_of("generation.begin") == std::vector<std::string>{"generation.begin:1"});
  drain("c", true);
  CHECK(names_of("generation.begin")
        == std::vector<std::string>{"generation.begin:1", "generation.begin:2"});
  discover("a:1:1\nb:2:1\nc:3:1\n"); // the script still lists it: it stays out
  CHECK(names_of("generation.begin").size() == 2);
  vote("a", 0);
  vote("b", 0);
  CHECK(names_of("generation.released").size() == 2);
  sched.advance_time(std::chrono::milliseconds(1100)); // the grace after the release
  sched.run();
  CHECK(log.signals[c0] == std::vector<int32_t>{SIGTERM});
  exit(c0, 143);
  CHECK(names_of("host.blacklisted").empty());
  auto ev = events();
  auto it = std::find_if(ev.begin(), ev.end(), [](auto& e) { return e["name"] == "host.draining"; });
  REQUIRE(it != ev.end());
  CHECK((*it)["context"]["host"] == "c");
  // back: the next discovery that lists it adds it again
  drain("c", false);
  discover("a:1:1\nb:2:1\nc:3:1\n");
  CHECK(names_of("generation.begin").size() == 3);
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a drained node whose agent restarts undrained (a rolling "
                           "upgrade's step) is taken back at the next discovery") {
  // c drains and the job leaves it; c's agent restarts (its colocator is lost) and comes
  // back undrained: its new colocator says so at connect, and the job grows onto it
  // again instead of keeping the old colocator's drain mark forever.
  start_elastic({"a", "b", "c", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\nc:3:1\n");
  auto c0 = slot_on("c", 0);
  drain("c", true);
  vote("a", 0);
  vote("b", 0);
  REQUIRE(names_of("generation.released").size() == 2);
  sched.advance_time(std::chrono::milliseconds(1100)); // the grace after the release
  sched.run();
  exit(c0, 143);
  caf::anon_send_exit(log.colocators.at("c"), caf::exit_reason::kill); // the agent restarts
  sched.run();
  CHECK(names_of("host.lost").size() == 1);
  sched.advance_time(std::chrono::seconds(6)); // the lost host's retry wait
  discover("a:1:1\nb:2:1\nc:3:1\n");        // the restarted agent is listed: reconnect
  discover("a:1:1\nb:2:1\nc:3:1\n");        // ... and, undrained, used
  CHECK(names_of("generation.begin").size() == 3);
  vote("a", 0);
  vote("b", 0);
  CHECK(names_of("generation.released").size() == 3);
  CHECK(env_value(log.envs[slot_on("c", 0)], "HOROVOD_SIZE") == "3");
  CHECK(names_of("host.blacklisted").empty());
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a drained node whose agent is lost before the re-join "
                           "costs nothing: the plan without it is released, nobody blamed") {
  // The drain already took c out of generation 2; its agent dying before a and b
  // re-joined (their collective with c's rank fails: they vote) is no new failure: no
  // third plan, no reset counted, no blacklist, and the job ends 0.
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000),
                [](job_config& c) { c.elastic->reset_limit = 1; });
  discover("a:1:1\nb:2:1\nc:3:1\n");
  drain("c", true);
  REQUIRE(names_of("generation.begin").size() == 2);
  caf::anon_send_exit(log.colocators.at("c"), caf::exit_reason::kill);
  sched.run();
  CHECK(names_of("host.lost").size() == 1); // seen, and taken for what it is
  vote("a", 0);
  vote("b", 0);
  CHECK(names_of("generation.begin").size() == 2);
  CHECK(names_of("generation.released").size() == 2);
  CHECK(names_of("host.blacklisted").empty());
  exit(slot_on("a", 0), 0);
  exit(slot_on("b", 0), 0);
  for (int i = 0; i < 5 && !job_ended(); ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  REQUIRE(job_ended());
  CHECK(result->exit_code == 0);
}

TEST_CASE_FIXTURE(fixture, "elastic: a node that drains between the votes of a forming plan is "
                           "left out of the plan that replaces it; the votes already in count") {
  // Generation 2 adds c; a has voted, b has not when b's drain comes. Generation 3 (a, c)
  // replaces 2 before its release, a's held vote releases it at once, c's fresh rank
  // starts as rank 1 of 2, and b's rank is stopped after the grace, not blamed.
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  auto b0 = slot_on("b", 0);
  discover("a:1:1\nb:2:1\nc:3:1\n");
  vote("a", 0);
  drain("b", true);
  CHECK(names_of("generation.begin")
        == std::vector<std::string>{"generation.begin:1", "generation.begin:2",
                                    "generation.begin:3"});
  CHECK(names_of("generation.released")
        == std::vector<std::string>{"generation.released:1", "generation.released:3"});
  auto c0 = slot_on("c", 0);
  CHECK(std::count(log.envs[c0].begin(), log.envs[c0].end(), "HOROVOD_RANK=1") == 1);
  CHECK(std::count(log.envs[c0].begin(), log.envs[c0].end(), "HOROVOD_SIZE=2") == 1);
  vote("b", 0); // its re-join is answered -1
  sched.advance_time(std::chrono::milliseconds(1100));
  sched.run();
  CHECK(log.signals[b0] == std::vector<int32_t>{SIGTERM});
  exit(b0, 0);
  CHECK(names_of("host.blacklisted").empty());
  CHECK(names_of("generation.begin").size() == 3);
  interrupt();
}

// -- warm joins and hvd.init()'s rendezvous ------------------------------------------------

namespace {

// What the rendezvous server tells the coordinator when a rank of the served plan (store
// generation `g`) begins (connected false) or finishes a Gloo rendezvous of `scope`.
void gloo_progress(fixture& f, uint64_t g, const std::string& scope, int rank, bool connected) {
  caf::send_as(f.coordinator(), f.coordinator(), reached_atom::value, g, scope, int32_t{rank}, connected,
                 std::string{"127.0.0.1"});
  f.sched.run();
}

// ... and when a newcomer's first request, PUT /global/rank_<rank>, is held at lot `g`.
void park(fixture& f, uint64_t g, int rank) {
  caf::send_as(f.coordinator(), f.coordinator(), parked_atom::value, g, int32_t{rank}, std::string{"127.0.0.1"});
  f.sched.run();
}

size_t count_named(const std::vector<nlohmann::json>& ev, const std::string& name) {
  return static_cast<size_t>(
      std::count_if(ev.begin(), ev.end(), [&](auto& e) { return e["name"] == name; }));
}

} // namespace

namespace {

std::vector<std::string> failures(const std::vector<nlohmann::json>& ev) {
  std::vector<std::string> out;
  for (auto& e : ev)
    if (e["name"] == "failure")
      out.push_back(e["context"]["cause"].get<std::string>());
  return out;
}

// The hosts of each generation that began, in order ("a:1,b:2" for a plan with one rank on
// a and two on b).
std::vector<std::string> layouts(const std::vector<nlohmann::json>& ev) {
  std::vector<std::string> out;
  for (auto& e : ev) {
    if (e["name"] != "generation.begin")
      continue;
    std::vector<std::pair<std::string, int>> per;
    for (auto& row : e["context"]["plan"]) {
      auto h = row["host"].get<std::string>();
      if (per.empty() || per.back().first != h)
        per.emplace_back(h, 0);
      ++per.back().second;
    }
    std::string text;
    for (auto& [h, n] : per)
      text += fmt::format("{}{}:{}", text.empty() ? "" : ",", h, n);
    out.push_back(text);
  }
  return out;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "elastic: a node that drains with the job's only state keeps one "
                           "rank as its carrier beside the new hosts, and is left once they "
                           "hold the state") {
  // Both ranks run on a, the only host: a drain there would take the training state with
  // it. a's rank 0 stays in the next plan beside b's newcomers; once they finished
  // hvd.init() (they were sent the state), the plan after it leaves a, nobody blamed.
  start_elastic({"a", "b"}, std::chrono::milliseconds(1000));
  discover("a:1:2\n");
  for (int r = 0; r < 2; ++r) { // hvd.init() done: the ranks hold state
    gloo_progress(*this, 1, "global", r, false);
    gloo_progress(*this, 1, "global", r, true);
  }
  auto a0 = slot_on("a", 0), a1 = slot_on("a", 1);
  drain("a", true); // nowhere to carry the state to yet: the job runs on, unbroken
  CHECK_FALSE(job_ended());
  CHECK(failures(events()).empty());
  CHECK(layouts(events()) == std::vector<std::string>{"a:2"});
  discover("b:2:2\n"); // the cluster lists another host
  CHECK(layouts(events()) == std::vector<std::string>{"a:2", "a:1,b:2"});
  auto b0 = slot_on("b", 0), b1 = slot_on("b", 1);
  CHECK(env_value(log.envs[b0], "HOROVOD_RANK") == "1");
  discover("b:2:2\n"); // asked again: the same plan, no new generation
  CHECK(layouts(events()).size() == 2);
  vote("a", 0);
  vote("a", 1); // answered -1: it leaves
  park(*this, 2, 1);
  park(*this, 2, 2);
  REQUIRE(names_of("generation.released").size() == 2);
  CHECK(layouts(events()).size() == 2); // the newcomers hold nothing yet: a stays
  for (int r = 0; r < 3; ++r)
    gloo_progress(*this, 2, "global", r, false);
  for (int r = 0; r < 3; ++r)
    gloo_progress(*this, 2, "global", r, true);
  // b's ranks hold the state now: the next plan leaves a
  CHECK(layouts(events()) == std::vector<std::string>{"a:2", "a:1,b:2", "b:2"});
  CHECK(env_value(log.envs[b0], "HOROVOD_RANK") == "1"); // carried over, not restarted
  CHECK(slot_on("b", 0) == b0);
  CHECK(slot_on("b", 1) == b1);
  vote("b", 0);
  vote("b", 1);
  CHECK(names_of("generation.released").size() == 3);
  sched.advance_time(std::chrono::milliseconds(1100)); // the grace after the release
  sched.run();
  CHECK(log.signals[a0] == std::vector<int32_t>{SIGTERM});
  CHECK(log.signals[a1] == std::vector<int32_t>{SIGTERM});
  CHECK(names_of("host.blacklisted").empty());
  CHECK(failures(events()).empty());
  CHECK(count_named(events(), "host.carries") == 1);
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a draining node with the job's only state and no other host "
                           "runs on until the drain stops its ranks, then the job fails naming "
                           "the lost state") {
  start_elastic({"a"}, std::chrono::milliseconds(1000));
  discover("a:1:2\n");
  for (int r = 0; r < 2; ++r) {
    gloo_progress(*this, 1, "global", r, false);
    gloo_progress(*this, 1, "global", r, true);
  }
  drain("a", true);
  discover("a:1:2\n"); // still listed by a script: a draining node stays out
  CHECK_FALSE(job_ended());
  CHECK(layouts(events()) == std::vector<std::string>{"a:2"});
  exit(slot_on("a", 0), 143, "node agent 'a' stopped its ranks at the end of its drain");
  exit(slot_on("a", 1), 143, "node agent 'a' stopped its ranks at the end of its drain");
  for (int i = 0; i < 5 && !job_ended(); ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  REQUIRE(job_ended());
  CHECK(result->exit_code == 1);
  auto ev = events();
  auto end = std::find_if(ev.begin(), ev.end(), [](auto& e) { return e["name"] == "job.end"; });
  REQUIRE(end != ev.end());
  CHECK((*end)["context"]["cause"].dump().find("no host of generation 1 is left")
        != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "elastic, warm joins: a newcomer starts when its plan forms, pointed "
                           "at the plan's lot; the plan is released only once it waits there") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  gloo_progress(*this, 1, "global", 0, false); // the ranks speak Gloo through the server
  auto main_port = env_value(log.envs[slot_on("a", 0)], "HOROVOD_GLOO_RENDEZVOUS_PORT");
  discover("a:1:1\nb:2:1\nc:3:1\n"); // c joins: generation 2 forms
  REQUIRE(log.envs.size() == 3);     // c's process started already, with generation 2's place
  auto& c_env = log.envs[slot_on("c", 0)];
  CHECK(env_value(c_env, "HOROVOD_RANK") == "2");
  CHECK(env_value(c_env, "HOROVOD_SIZE") == "3");
  CHECK(env_value(c_env, "CAF_HVD_GENERATION") == "2");
  CHECK(env_value(c_env, "HOROVOD_GLOO_RENDEZVOUS_PORT") != main_port); // the lot
  // the running ranks re-join (told, or after a failure): the plan still waits for c
  vote("a", 0);
  vote("b", 0);
  CHECK(names_of("generation.released").size() == 1);
  CHECK(count_named(events(), "generation.ready") == 0);
  park(*this, 2, 2); // c's first request reached the lot
  CHECK(count_named(events(), "rank.parked") == 1);
  CHECK(count_named(events(), "generation.ready") == 1);
  CHECK(names_of("generation.released")
        == std::vector<std::string>{"generation.released:1", "generation.released:2"});
  CHECK(log.envs.size() == 3); // nothing started at the release
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic, warm joins: a request at the lot counts for a newcomer only "
                           "from its own host; another host's claim releases nothing") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  gloo_progress(*this, 1, "global", 0, false);
  discover("a:1:1\nb:2:1\nc:3:1\n"); // c's newcomer (rank 2) starts, pointed at lot 2
  caf::send_as(job, coordinator(), allow_atom::value, std::string{"a"},
                 std::vector<std::string>{"10.0.0.1"}, false, uint32_t{0});
  caf::send_as(job, coordinator(), allow_atom::value, std::string{"c"},
                 std::vector<std::string>{"10.0.0.3"}, false, uint32_t{0});
  vote("a", 0);
  vote("b", 0);
  // a process on a (any client the job's allowlist admits) claims c's first request
  caf::send_as(coordinator(), coordinator(), parked_atom::value, uint64_t{2}, int32_t{2},
                 std::string{"10.0.0.1"});
  sched.run();
  // ... and that rank 2 began and finished generation 1's global rendezvous: a plan it
  // was never in (store generation 1 has ranks 0 and 1 only) is not reported at all;
  // the same from a's address for rank 1 (b's) is ignored too
  caf::send_as(coordinator(), coordinator(), reached_atom::value, uint64_t{1}, std::string{"global"}, int32_t{1},
                 true, std::string{"10.0.0.1"});
  sched.run();
  auto ev = events();
  CHECK(count_named(ev, "rank.parked") == 0);
  CHECK(count_named(ev, "generation.ready") == 0);
  CHECK(count_named(ev, "rank.rendezvous") == 1); // a's own report above only
  CHECK(count_named(ev, "rendezvous.refused") == 2);
  CHECK(names_of("generation.released") == std::vector<std::string>{"generation.released:1"});
  for (auto& e : ev)
    if (e["name"] == "rendezvous.refused") {
      CHECK(e["context"]["client"] == "10.0.0.1");
      CHECK((e["context"]["host"] == "c" || e["context"]["host"] == "b"));
    }
  // c's own request counts
  caf::send_as(coordinator(), coordinator(), parked_atom::value, uint64_t{2}, int32_t{2},
                 std::string{"10.0.0.3"});
  sched.run();
  CHECK(count_named(events(), "rank.parked") == 1);
  CHECK(names_of("generation.released")
        == std::vector<std::string>{"generation.released:1", "generation.released:2"});
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic, warm joins: a newcomer that fails before its release costs "
                           "the running ranks nothing: the released plan resumes, untold") {
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\n");
  gloo_progress(*this, 1, "global", 0, false);
  auto a0 = slot_on("a", 0), b0 = slot_on("b", 0);
  discover("a:1:1\nb:2:1\nc:3:1\n");
  exit(slot_on("c", 0), 1); // the newcomer dies while it imports
  auto ev = events();
  CHECK(count_named(ev, "host.blacklisted") == 1);
  CHECK(count_named(ev, "notify.change") == 1); // generation 2's, never sent (no notify.sent)
  CHECK(count_named(ev, "notify.sent") == 0);
  // generation 3 is the released plan again: released at once, nobody re-joins
  CHECK(names_of("generation.released")
        == std::vector<std::string>{"generation.released:1", "generation.released:3"});
  CHECK(log.signals[a0].empty());
  CHECK(log.signals[b0].empty());
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: an abort inside a rendezvous that a peer's failure broke "
                           "blames no host, even when it is reported first") {
  // Horovod 0.28.1's init-time rendezvous runs outside any try (operations.cc): a rank
  // whose peer dies there ends with std::terminate, often before the peer's end is seen.
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:1\nb:2:1\nc:3:1\n");
  for (int r = 0; r < 3; ++r) { // every rank began hvd.init(); none finished it
    gloo_progress(*this, 1, "global", r, false);
    gloo_progress(*this, 1, "global", r, true);
    gloo_progress(*this, 1, "cross_0", r, false);
  }
  auto a0 = slot_on("a", 0), b0 = slot_on("b", 0), c0 = slot_on("c", 0);
  caf::send_as(log.spawned.at(a0), job, exited_atom::value, rank_exit{a0, "fake", 0, SIGABRT, {}, {}});
  log.workers.erase(a0);
  sched.run();
  CHECK(count_named(events(), "host.blacklisted") == 0); // judged a moment later
  exit(b0, 1);                                           // the cause: b's rank failed
  sched.advance_time(std::chrono::milliseconds(1100));
  sched.run();
  auto ev = events();
  CHECK(count_named(ev, "host.blacklisted") == 1); // b's host only
  CHECK(count_named(ev, "rank.collateral") == 1);  // a's abort
  // c never finished hvd.init(): it holds no state and starts afresh in the next plan
  CHECK(count_named(ev, "rank.restarted") == 1);
  CHECK(log.signals[c0] == std::vector<int32_t>{SIGKILL});
  interrupt();
}

TEST_CASE_FIXTURE(fixture, "elastic: a state holder inside a rendezvous that its generation's "
                           "failure broke is stopped at once, one whose scopes lost nobody is "
                           "not") {
  // hvd.init() goes through global, local_<host> and cross_<local rank>: a rank that lost
  // a peer of a scope it has not finished ends with std::terminate at Horovod's Gloo
  // timeout (operations.cc); one whose unfinished scopes lost nobody finishes hvd.init()
  // and recovers from the failure in its next collective, with its state.
  start_elastic({"a", "b", "c"}, std::chrono::milliseconds(1000));
  discover("a:1:2\nb:2:1\n"); // a:0 rank 0, a:1 rank 1 (local rank 1), b:0 rank 2
  for (int r = 0; r < 3; ++r) {
    gloo_progress(*this, 1, "global", r, false);
    gloo_progress(*this, 1, "global", r, true);
  }
  for (auto [lr, cr] : std::vector<std::pair<int, int>>{{0, 0}, {1, 0}, {0, 1}})
    gloo_progress(*this, 1, "cross_" + std::to_string(lr), cr, true);
  auto a0 = slot_on("a", 0), a1 = slot_on("a", 1), b0 = slot_on("b", 0);
  discover("a:1:2\nb:2:1\nc:3:1\n"); // generation 2 adds c (rank 3, local rank 0)
  park(*this, 2, 3);
  vote("a", 0);
  vote("a", 1);
  vote("b", 0);
  REQUIRE(names_of("generation.released").size() == 2);
  for (int r = 0; r < 4; ++r) { // store generation 2: everyone finished global
    gloo_progress(*this, 2, "global", r, false);
    gloo_progress(*this, 2, "global", r, true);
  }
  exit(slot_on("c", 0), 1); // c dies inside cross_0, which a:0 and b:0 wait in
  auto ev = events();
  CHECK(count_named(ev, "rank.doomed") == 2);
  CHECK(log.signals[a0] == std::vector<int32_t>{SIGKILL});
  CHECK(log.signals[b0] == std::vector<int32_t>{SIGKILL});
  CHECK(log.signals[a1].empty()); // cross_1 lost nobody: it keeps its state
  CHECK(count_named(ev, "host.blacklisted") == 1);
  CHECK(count_named(ev, "job.end") == 0); // a:1 carries the state on
  interrupt();
}

// -- executor mode -------------------------------------------------------------------------

namespace {

// The executor's owner: the test's end of the job's control socketpair. Frames the job
// writes are read while the test scheduler runs (the channel's threads post to it).
struct owner_fixture : fixture {
  int sv[2] = {-1, -1};
  owner_fixture() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0); }
  ~owner_fixture() {
    if (sv[1] >= 0)
      ::close(sv[1]);
  }
  void start_executor(int np) {
    job_config c;
    c.embedded = true;
    c.np = np;
    c.hosts = {host_spec{"localhost", 0, static_cast<uint32_t>(np)}};
    c.command = {"python3", "-m", "caf_hvd.worker"};
    c.cwd = "/";
    c.torch_store = torch_store_mode::off;
    c.executor_fd = sv[0];
    job = spawn_driver(sys, c, result);
    sched.run();
  }
  void send(frame_kind k, uint64_t id, uint32_t rank, std::string payload) {
    frame f;
    f.kind = k;
    f.id = id;
    f.rank = rank;
    f.payload = std::move(payload);
    REQUIRE(write_frame(sv[1], f));
  }
  // Runs the scheduler until `pred` holds (messages from the channel's threads arrive
  // in real time).
  template <class Pred> void run_until(Pred pred, const char* what) {
    for (int i = 0; i < 500; ++i) {
      sched.run();
      if (pred())
        return;
      ::usleep(10000);
    }
    FAIL("timed out waiting for " << what);
  }
  frame next_frame() {
    for (int i = 0; i < 500; ++i) {
      sched.run();
      pollfd p{sv[1], POLLIN, 0};
      if (::poll(&p, 1, 10) == 1) {
        auto f = read_frame(sv[1]);
        REQUIRE(f);
        return *f;
      }
    }
    FAIL("no frame from the job within 5 s");
    return {};
  }
  void answer(uint32_t slot, uint64_t call, std::string payload) {
    caf::send_as(log.spawned.at(slot), job, result_atom::value, slot, call, std::move(payload));
    sched.run();
  }
};

} // namespace

TEST_CASE_FIXTURE(owner_fixture, "executor: nothing starts before the owner's start frame; the "
                                 "boot call goes with every launch; results return per rank") {
  start_executor(3);
  CHECK(log.envs.empty());
  send(frame_kind::start, 0, 0, "BOOT");
  run_until([&] { return log.specs.size() == 3; }, "three launches");
  for (auto& [id, spec] : log.specs) {
    CHECK(spec.executor);
    CHECK(spec.boot == "BOOT");
  }
  auto table = next_frame();
  REQUIRE(table.kind == frame_kind::ranks);
  auto j = nlohmann::json::parse(table.payload);
  CHECK(j["size"] == 3);
  CHECK(j["ranks"][2]["local_rank"] == 2);
  // boot answers pass through as results of call 0, in the order they come
  for (int r : {1, 0, 2}) {
    answer(slot_of_rank(r), 0, "r" + std::to_string(r));
    auto b = next_frame();
    CHECK(b.kind == frame_kind::result);
    CHECK(b.id == 0);
    CHECK(b.rank == static_cast<uint32_t>(r));
    CHECK(b.payload == "r" + std::to_string(r));
  }
  // a call to all ranks reaches every worker with the same payload
  send(frame_kind::call, 1, all_ranks, "CALL1");
  run_until([&] { return log.calls.size() == 3; }, "the call at every worker");
  for (auto& [slot, calls] : log.calls)
    CHECK(calls == std::vector<std::pair<uint64_t, std::string>>{{1, "CALL1"}});
  for (int r : {2, 0, 1})
    answer(slot_of_rank(r), 1, "v" + std::to_string(r));
  for (int r : {2, 0, 1}) {
    auto f = next_frame();
    CHECK(f.kind == frame_kind::result);
    CHECK(f.id == 1);
    CHECK(f.rank == static_cast<uint32_t>(r));
    CHECK(f.payload == "v" + std::to_string(r));
  }
  // a call to one rank reaches only that rank; a rank that does not exist is refused
  send(frame_kind::call, 2, 2, "ONLY2");
  run_until([&] { return log.calls[slot_of_rank(2)].size() == 2; }, "the call at rank 2");
  CHECK(log.calls[slot_of_rank(0)].size() == 1);
  send(frame_kind::call, 3, 7, "NOBODY");
  auto refused = next_frame();
  CHECK(refused.kind == frame_kind::failed);
  CHECK(refused.id == 3);
  CHECK(refused.payload == "there is no rank 7: the job has 3 ranks");
  // shutdown: every channel closes, the ranks exit 0, the end frame says 0; the call
  // rank 2 never answered fails, it is not dropped
  send(frame_kind::shutdown, 0, 0, "");
  run_until([&] { return log.closes.size() == 3; }, "every channel closed");
  for (int r = 0; r < 3; ++r)
    exit(slot_of_rank(r), 0);
  std::vector<frame> rest;
  do
    rest.push_back(next_frame());
  while (rest.back().kind != frame_kind::end);
  REQUIRE(rest.size() == 2);
  CHECK(rest[0].kind == frame_kind::failed);
  CHECK(rest[0].id == 2);
  CHECK(rest[0].rank == 2);
  CHECK(rest[1].id == 0); // exit code
  CHECK(job_ended());
  CHECK(result->exit_code == 0);
}

TEST_CASE_FIXTURE(owner_fixture, "executor: a rank that dies fails its call with rank, host "
                                 "and cause; the others' calls name the first failure") {
  start_executor(3);
  send(frame_kind::start, 0, 0, "");
  CHECK(next_frame().kind == frame_kind::ranks);
  send(frame_kind::call, 1, all_ranks, "C");
  run_until([&] { return log.calls.size() == 3; }, "the call at every worker");
  answer(slot_of_rank(0), 1, "done0");
  CHECK(next_frame().rank == 0);
  caf::send_as(log.spawned.at(slot_of_rank(1)), job, exited_atom::value,
               rank_exit{slot_of_rank(1), "fake", 0, SIGKILL, {}, {}});
  log.workers.erase(slot_of_rank(1));
  // A rank's answer reaches the job from its channel's reader, not through its worker, so
  // it may come right after the exit report that failed the call (queued behind it, while
  // the job still runs); and rank 0 answered already. Neither reaches the owner: each
  // call ends once per rank.
  caf::send_as(log.spawned.at(slot_of_rank(1)), job, result_atom::value, slot_of_rank(1),
               uint64_t{1}, std::string{"late1"});
  caf::send_as(log.spawned.at(slot_of_rank(0)), job, result_atom::value, slot_of_rank(0),
               uint64_t{1}, std::string{"again0"});
  sched.run();
  std::map<uint32_t, std::string> failed;
  frame f;
  while ((f = next_frame()).kind != frame_kind::end) {
    REQUIRE(f.kind == frame_kind::failed);
    CHECK(f.id == 1);
    failed[f.rank] = f.payload;
  }
  CHECK(failed.size() == 2); // rank 0 had answered
  CHECK(failed[1] == "rank 1 on host fake died: signal 9 (Killed)");
  CHECK(failed[2].find("rank 2 on host fake was stopped (signal 15 (Terminated)) because the "
                       "worker group failed: rank 1 on host fake failed first: signal 9")
        == 0);
  CHECK(f.id == 137);
  CHECK(f.payload.find("rank 1 on host fake failed first: signal 9 (Killed)") == 0);
  CHECK(job_ended());
}

TEST_CASE_FIXTURE(owner_fixture, "executor: a rank that exits 0 before shutdown fails the group; "
                                 "an owner that goes away stops the job") {
  SUBCASE("early exit") {
    start_executor(2);
    send(frame_kind::start, 0, 0, "");
    CHECK(next_frame().kind == frame_kind::ranks);
    exit(slot_of_rank(0), 0);
    frame f;
    while ((f = next_frame()).kind != frame_kind::end) {
    }
    CHECK(f.id == 1);
    CHECK(f.payload.find("ended (exit code 0) while the executor still needed it")
          != std::string::npos);
  }
  SUBCASE("owner gone") {
    start_executor(2);
    send(frame_kind::start, 0, 0, "");
    CHECK(next_frame().kind == frame_kind::ranks);
    ::close(sv[1]);
    sv[1] = -1;
    run_until([&] { return log.terminates == 1; }, "the ranks stopped");
    CHECK(job_ended());
    CHECK(result->exit_code != 0);
  }
}

// -- GPUs ------------------------------------------------------------------------------------

TEST_CASE_FIXTURE(fixture, "GPU job: the node lends np x gpus_per_slot devices before any "
                           "launch; shared and per-rank visibility") {
  SUBCASE("shared") {
    log.gpus = 6;
    log.gpus_taken = 1; // another job holds device 0
    start(2, std::chrono::milliseconds(5000), [](job_config& c) { c.gpus_per_slot = 2; });
    REQUIRE(log.envs.size() == 2);
    CHECK(log.lent["fake"] == std::vector<int32_t>{1, 2, 3, 4});
    for (int r = 0; r < 2; ++r) {
      auto& env = log.envs[slot_of_rank(r)];
      CHECK(env_value(env, "CUDA_VISIBLE_DEVICES") == "1,2,3,4");
      CHECK(env_value(env, "HOROVOD_GPU_OPERATIONS") == "NCCL");
    }
  }
  SUBCASE("per-rank") {
    log.gpus = 4;
    start(2, std::chrono::milliseconds(5000), [](job_config& c) {
      c.gpus_per_slot = 2;
      c.cuda_per_rank = true;
    });
    CHECK(env_value(log.envs[slot_of_rank(0)], "CUDA_VISIBLE_DEVICES") == "0,1");
    CHECK(env_value(log.envs[slot_of_rank(1)], "CUDA_VISIBLE_DEVICES") == "2,3");
  }
  SUBCASE("too few: refused before anything starts, naming the host and counts") {
    log.gpus = 4;
    log.gpus_taken = 3;
    start(2, std::chrono::milliseconds(5000), [](job_config& c) { c.gpus_per_slot = 1; });
    CHECK(log.envs.empty());
    CHECK(log.lent.empty());
    CHECK(job_ended());
    CHECK(result->exit_code == 1);
  }
  if (!log.envs.empty()) {
    for (int r = 0; r < 2; ++r)
      exit(slot_of_rank(r), 0);
    CHECK(job_ended());
  }
}

TEST_CASE_FIXTURE(fixture, "registration: a worker that reports another host than its slot's "
                           "fails the job, naming both, before anything is launched") {
  log.report_as["fake"] = "elsewhere";
  events_path = fmt::format("/tmp/caf-hvd-job-test-{}.jsonl", ::getpid());
  start(2, std::chrono::milliseconds(1000), [&](job_config& c) { c.events_file = events_path; });
  CHECK(log.envs.empty()); // nothing launched
  CHECK(job_ended());
  CHECK(result->exit_code == 1);
  std::string cause;
  for (auto& e : events())
    if (e["name"] == "job.end")
      cause = e["context"]["cause"].get<std::string>();
  CHECK(cause.find("its worker reports host 'elsewhere' but the slot was placed on 'fake'")
        != std::string::npos);
}

TEST_CASE_FIXTURE(fixture, "registration: a worker that never reports its host is named when the "
                           "start timeout passes") {
  log.silent_workers = true;
  events_path = fmt::format("/tmp/caf-hvd-job-test-{}.jsonl", ::getpid());
  start(1, std::chrono::milliseconds(1000), [&](job_config& c) {
    c.events_file = events_path;
    c.start_timeout = std::chrono::milliseconds(2000);
  });
  CHECK(log.envs.empty());
  for (int i = 0; i < 5 && !job_ended(); ++i) {
    sched.trigger_timeouts();
    sched.run();
  }
  CHECK(job_ended());
  CHECK(result->exit_code == 1);
  std::string causes;
  for (auto& e : events())
    if (e["name"] == "failure" || e["name"] == "job.end")
      causes += e["context"]["cause"].dump();
  // the job's own start timeout comes first (2 s, before the coordinator's 30 s for a
  // report) and names the slot and what it waited for
  CHECK_MESSAGE(causes.find("start timeout (2 s) expired waiting for: rank 0 on fake (its "
                            "worker)")
                    != std::string::npos,
                causes);
}

TEST_CASE_FIXTURE(owner_fixture, "executor: an elastic owner's kill_host SIGKILLs only that "
                                 "host's ranks; a static job's owner that sends it broke its "
                                 "channel") {
  SUBCASE("elastic") {
    start_elastic({"a", "b"}, std::chrono::milliseconds(1000),
                  [&](job_config& c) { c.executor_fd = sv[0]; });
    send(frame_kind::start, 0, 0, "BOOT");
    // the answer to a call (refused: elastic) says the start frame before it was taken
    send(frame_kind::call, 1, all_ranks, "C");
    auto refused = next_frame();
    CHECK(refused.kind == frame_kind::failed);
    CHECK(refused.id == 1);
    discover("a:1:1\nb:2:1\n");
    REQUIRE(log.envs.size() == 2);
    CHECK(next_frame().kind == frame_kind::ranks);
    send(frame_kind::kill_host, 0, 0, "nobody"); // no ranks there: nothing happens
    send(frame_kind::kill_host, 0, 0, "b");
    run_until([&] { return !log.signals[slot_on("b", 0)].empty(); }, "a signal to b's rank");
    CHECK(log.signals[slot_on("b", 0)] == std::vector<int32_t>{SIGKILL});
    CHECK(log.signals[slot_on("a", 0)].empty());
    CHECK_FALSE(job_ended());
    interrupt();
  }
  SUBCASE("static") {
    start_executor(2);
    send(frame_kind::start, 0, 0, "");
    CHECK(next_frame().kind == frame_kind::ranks);
    send(frame_kind::kill_host, 0, 0, "localhost");
    frame f;
    while ((f = next_frame()).kind != frame_kind::end) {
    }
    CHECK(f.payload.find("sent kill_host to a static job") != std::string::npos);
    for (auto& [slot, sigs] : log.signals) // the failed job's teardown, not a kill
      CHECK(sigs.front() == SIGTERM);
  }
}
