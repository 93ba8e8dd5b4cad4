// Actor-level tests on CAF's deterministic test scheduler (one thread, virtual time).
#include <doctest/doctest.h>

#include <caf/scheduler/test_coordinator.hpp>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <stdlib.h>
#include <thread>
#include <variant>

#include "actors/cluster.hpp"
#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "actors/node_actors.hpp"
#include "actors/protocol.hpp"
#include "runtime/network/net.hpp"

using namespace cafhvd;

namespace {

struct fixture {
  static hvd_config& init(hvd_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    return c;
  }
  hvd_config cfg;
  caf::actor_system sys{init(cfg)};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
};

} // namespace

// What a fake worker was told.
struct worker_log {
  std::vector<int32_t> signals;
  std::vector<std::string> stops;
  int calls = 0;
};

worker_actor::behavior_type fake_worker(worker_actor::pointer self,
                                        std::shared_ptr<worker_log> log) {
  return {
      [](launch_atom, launch_spec&) -> int32_t { return 0; },
      [=](terminate_atom, int32_t sig) {
        log->signals.push_back(sig);
        if (sig == 9)
          self->quit(); // as a worker whose process was killed
      },
      [=](stop_atom, std::string& why) {
        log->stops.push_back(why);
        log->signals.push_back(15);
      },
      [](output_atom, output_batch&) {},
      [](exited_atom, rank_exit&) {},
      [=](call_atom, uint64_t, uint32_t, std::string&) { ++log->calls; },
      [](close_atom) {},
      [](result_atom, uint64_t, std::string&) {},
      [](log_atom, std::string&) {},
      [](chanend_atom, std::string&) {},
      [](alive_atom) { return uint32_t{0}; },
      [](deadline_atom, uint64_t) {},
  };
}

driver_actor::behavior_type fake_driver() {
  return {
      [](output_atom, output_batch&) { return caf::ok_atom::value; },
      [](exited_atom, rank_exit&) {},
      [](tstore_atom, std::string&) {},
      [](result_atom, uint32_t, uint64_t, std::string&) {},
      [](log_atom, uint32_t, std::string&) { return caf::ok_atom::value; },
      [](chanfail_atom, uint32_t, std::string&) {},
      [](drain_atom, std::string&, bool, std::string&) {},
      [](cancel_atom, std::string&, std::string&) {},
  };
}

TEST_CASE_FIXTURE(fixture,
                  "an agent's stop escalates: SIGTERM with the reason, SIGKILL after grace") {
  auto driver = sys.spawn(fake_driver);
  cfg.node->guardian = spawn_guardian(sys);
  auto colocator = sys.spawn(colocator_fn, driver, coordinator_actor{}, std::string{"job"}, int32_t{5000}, signed_ticket{});
  auto log = std::make_shared<worker_log>();
  auto worker = sys.spawn(fake_worker, log);
  caf::send_as(worker, colocator, enlist_atom::value, worker);
  sched.run();
  // the agent's stop comes from its guardian
  caf::send_as(cfg.node->guardian, colocator, stop_atom::value,
               std::string{"node agent 'a' received Terminated"});
  sched.run();
  CHECK(log->stops == std::vector<std::string>{"node agent 'a' received Terminated"});
  CHECK(log->signals == std::vector<int32_t>{15}); // no SIGKILL before the grace period
  sched.trigger_timeouts();                        // the grace period passes (virtual time)
  sched.run();
  CHECK(log->signals == std::vector<int32_t>{15, 9});
  // The worker is gone, so the stopping colocator ends too.
  bool colocator_down = false;
  caf::scoped_actor self{sys};
  self->monitor(colocator);
  sched.run();
  self->receive([&](caf::down_msg&) { colocator_down = true; },
                caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(colocator_down);
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
  post_from(cfg.node->guardian, shutdown_atom::value);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a cancel from the agent stops that job's ranks (SIGTERM, SIGKILL "
                           "after the grace) and tells its driver who cancelled it") {
  cfg.node->name = "cn";
  cfg.node->guardian = spawn_guardian(sys);
  caf::scoped_actor driver{sys};
  auto colocator = sys.spawn(colocator_fn, caf::actor_cast<driver_actor>(driver.ptr()),
                             coordinator_actor{}, std::string{"job-7"}, int32_t{5000},
                             signed_ticket{});
  auto log = std::make_shared<worker_log>();
  auto worker = sys.spawn(fake_worker, log);
  caf::send_as(worker, colocator, enlist_atom::value, worker);
  sched.run();
  auto told = [&] {
    std::string out = "nothing";
    driver->receive([&](cancel_atom, std::string& node, std::string& by) { out = node + " " + by; },
                    caf::after(std::chrono::seconds(0)) >> [] {});
    return out;
  };
  // another job's cancel, or another owner's job of the same id (a driver's own cancel
  // names its owner; this job's owner is "" here, an agent without credentials): nothing
  post_from(cfg.node->guardian, cancel_atom::value, std::string{"job-8"}, std::string{},
            std::string{"'ops'"});
  post_from(cfg.node->guardian, cancel_atom::value, std::string{"job-7"}, std::string{"bob"},
            std::string{"'bob' (its owner)"});
  sched.run();
  CHECK(log->signals.empty());
  CHECK(told() == "nothing");
  post_from(cfg.node->guardian, cancel_atom::value, std::string{"job-7"}, std::string{},
            std::string{"'ops'"});
  sched.run();
  CHECK(told() == "cn 'ops'");
  CHECK(log->signals == std::vector<int32_t>{15}); // no SIGKILL before the grace period
  sched.trigger_timeouts();
  sched.run();
  CHECK(log->signals == std::vector<int32_t>{15, 9});
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
  post_from(cfg.node->guardian, shutdown_atom::value);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a driver's teardown escalates too, and a lost driver stops the ranks") {
  auto driver = sys.spawn(fake_driver);
  auto colocator = sys.spawn(colocator_fn, driver, coordinator_actor{}, std::string{"job"}, int32_t{2000}, signed_ticket{});
  auto log = std::make_shared<worker_log>();
  auto worker = sys.spawn(fake_worker, log);
  caf::send_as(worker, colocator, enlist_atom::value, worker);
  sched.run();
  caf::anon_send_exit(driver, caf::exit_reason::remote_link_unreachable);
  sched.run();
  CHECK(log->signals == std::vector<int32_t>{15});
  sched.trigger_timeouts();
  sched.run();
  CHECK(log->signals == std::vector<int32_t>{15, 9});
}

TEST_CASE_FIXTURE(fixture, "a lost driver's workers that were never launched end at once: the "
                           "colocator ends and the node's slots are free before any grace") {
  cfg.node->jobs->set_capacity(2);
  // a driver that takes the colocator's answer (the workers) and anything else
  auto driver_actor_ = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[](const std::vector<worker_actor>&) {}};
  });
  auto driver = caf::actor_cast<driver_actor>(driver_actor_);
  auto colocator = sys.spawn(colocator_fn, driver, coordinator_actor{}, std::string{"job"},
                             int32_t{60000}, signed_ticket{});
  // a colocator that waits on (the bug) would hold up the actor system's end: ended here
  // whatever the checks found
  std::shared_ptr<void> end_it(nullptr, [&](void*) {
    caf::anon_send_exit(colocator, caf::exit_reason::kill);
    sched.run();
  });
  sched.run();
  // the driver asks for two workers (real ones), then is lost before their launch
  caf::send_as(driver_actor_, colocator, workers_atom::value, std::vector<uint32_t>{1, 2},
               uint32_t{0});
  sched.run();
  cfg.node->jobs->open(99, job_summary{"other", "", 0, {}, 0}); // another job on the node
  std::string why;
  REQUIRE(cfg.node->jobs->take(99, 1, why).empty()); // the workers hold the node's slots
  CHECK(why.find("2 are held (2 by job job)") != std::string::npos);
  caf::scoped_actor self{sys};
  self->monitor(colocator);
  caf::anon_send_exit(driver_actor_, caf::exit_reason::remote_link_unreachable);
  sched.run(); // no timeout triggered: a worker with nothing to stop does not wait for one
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(down);
  auto jobs = cfg.node->jobs->snapshot(); // the lost driver's job is no longer listed
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].job == "other");
  CHECK(cfg.node->jobs->take(99, 2, why).size() == 2); // another job gets both slots
}

TEST_CASE_FIXTURE(fixture, "a job's new worker waits for the node slot of its own ending "
                           "worker (a replaced rank), in order and up to a deadline; a slot "
                           "held by another job is refused at once") {
  cfg.node->jobs->set_capacity(2);
  // the driver keeps each answer: workers, or the refusal's words
  auto answers = std::make_shared<std::vector<std::variant<std::vector<worker_actor>, std::string>>>();
  // (the driver asks, as a job does: a request, whose answer may come much later)
  auto driver_actor_ = sys.spawn([answers](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[=](colocator_actor c, std::vector<uint32_t>& slots, uint32_t ending) {
              self->request(c, caf::infinite, workers_atom::value, std::move(slots), ending)
                  .then([=](std::vector<worker_actor>& ws) { answers->emplace_back(std::move(ws)); },
                        [=](caf::error& e) { answers->emplace_back(to_string(e)); });
            },
            [=](colocator_actor c, launch_batch& b) {
              self->request(c, caf::infinite, launch_atom::value, std::move(b))
                  .then([](std::vector<int32_t>&) {}, [](caf::error&) {});
            }};
  });
  auto driver = caf::actor_cast<driver_actor>(driver_actor_);
  auto colocator = sys.spawn(colocator_fn, driver, coordinator_actor{}, std::string{"job"},
                             int32_t{1000}, signed_ticket{});
  std::shared_ptr<void> end_it(nullptr, [&](void*) {
    caf::anon_send_exit(colocator, caf::exit_reason::kill);
    caf::anon_send_exit(driver_actor_, caf::exit_reason::kill);
    sched.run();
  });
  sched.run();
  // `ending`: how many of the job's ranks on the node end (the job says so)
  auto ask = [&](std::vector<uint32_t> slots, uint32_t ending) {
    caf::anon_send(driver_actor_, colocator, std::move(slots), ending);
    sched.run();
  };
  // A worker ends as a real one does: its process (here /bin/true) exits. The exit comes
  // from the process's thread, so the scheduler runs until `n` answers are in (10 s).
  cfg.node->shim = CAF_HVD_EXEC;
  auto end_worker = [&](uint32_t slot, size_t n) {
    launch_batch b;
    b.argv = {"/bin/true"};
    b.cwd = "/";
    b.common_env = {"PATH=/usr/bin:/bin"};
    b.slots = {slot};
    b.envs = {{}};
    caf::anon_send(driver_actor_, colocator, std::move(b));
    for (int i = 0; i < 1000 && answers->size() < n; ++i) {
      sched.run();
      if (answers->size() < n)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  ask({1, 2}, 0); // the node's two slots
  REQUIRE(answers->size() == 1);
  auto first = std::get<std::vector<worker_actor>>(answers->at(0));
  REQUIRE(first.size() == 2);
  // rank 1 is replaced: its new worker (slot 3) is asked for before the old one is gone,
  // and then slot 4's (rank 2 replaced too)
  ask({3}, 1);
  ask({4}, 2);
  CHECK(answers->size() == 1); // both wait: nothing is refused
  end_worker(1, 2); // the old rank 1 ends
  REQUIRE(answers->size() == 2); // slot 3 first: the order they were asked in
  auto third = std::get<std::vector<worker_actor>>(answers->at(1));
  REQUIRE(third.size() == 1);
  CHECK(third[0]);
  // another job's ranks never free a slot for this one: a request that cannot fit even
  // once this job's own workers are gone is refused at once, as before
  cfg.node->jobs->open(99, job_summary{"other", "", 0, {}, 0});
  end_worker(2, 3); // the old rank 2 ends
  REQUIRE(answers->size() == 3); // slot 4 takes it
  REQUIRE(std::holds_alternative<std::vector<worker_actor>>(answers->at(2)));
  ask({5, 6, 7}, 2);
  REQUIRE(answers->size() == 4);
  auto refused = std::get<std::string>(answers->at(3));
  CHECK(refused.find("the node has 2 slots for all jobs and 2 are held") != std::string::npos);
  CHECK(refused.find("waited") == std::string::npos);
  // nor is growth onto a node the job's own running (not ending) ranks fill
  ask({9}, 0);
  REQUIRE(answers->size() == 5);
  CHECK(std::get<std::string>(answers->at(4)).find("waited") == std::string::npos);
  // an own worker that does not end in time: the request is refused at the deadline,
  // saying what it waited for
  ask({8}, 1);
  CHECK(answers->size() == 5);
  sched.trigger_timeouts(); // the handover's deadline (virtual time)
  sched.run();
  REQUIRE(answers->size() == 6);
  auto late = std::get<std::string>(answers->at(5));
  CHECK(late.find("cannot start 1 rank of this job: the node has 2 slots for all jobs and 2 "
                  "are held (2 by job job)") != std::string::npos);
  CHECK(late.find("waited") != std::string::npos);
  CHECK(late.find("for this job's own ranks on the node to end") != std::string::npos);
  std::string why;
  CHECK(cfg.node->jobs->take(99, 1, why).empty()); // nothing was taken by the refused ones
}

TEST_CASE_FIXTURE(fixture,
                  "the guardian stops every enlisted colocator and quits when they are gone") {
  auto guardian = spawn_guardian(sys);
  cfg.node->guardian = guardian;
  auto driver = sys.spawn(fake_driver);
  auto log = std::make_shared<worker_log>();
  auto colocator = sys.spawn(colocator_fn, driver, coordinator_actor{}, std::string{"job"}, int32_t{1000}, signed_ticket{});
  // (the colocator enlists itself with its agent's guardian)
  auto worker = sys.spawn(fake_worker, log);
  caf::send_as(worker, colocator, enlist_atom::value, worker);
  sched.run();
  caf::scoped_actor self{sys};
  self->monitor(guardian);
  // Another actor's shutdown, drain or kill (or one without a sender: a peer's looks the
  // same) does nothing: only the agent's own, sent as the guardian, count.
  auto before = refused_messages.load();
  caf::anon_send(guardian, shutdown_atom::value, std::string{"forged"});
  self->send(guardian, drain_atom::value, true, std::string{"forged drain"});
  self->send(guardian, kill_atom::value);
  self->send(guardian, enlist_atom::value, caf::actor_cast<caf::actor>(driver));
  sched.run();
  CHECK(log->stops.empty());
  CHECK(refused_messages.load() == before + 4);
  bool gone = false;
  self->receive([&](caf::down_msg&) { gone = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK_FALSE(gone);
  post_from(guardian, shutdown_atom::value, std::string{"node agent 'g' received Terminated"});
  sched.run();
  CHECK(log->stops == std::vector<std::string>{"node agent 'g' received Terminated"});
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK_FALSE(down); // its colocator still waits for its rank
  sched.trigger_timeouts();
  sched.run();
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(down);
  CHECK(log->signals == std::vector<int32_t>{15, 9});
  caf::anon_send_exit(driver, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE("protocol messages survive serialization") {
  hvd_config cfg;
  caf::actor_system sys{cfg};
  output_batch batch{3, 1, {"a", "", "line with spaces"}};
  auto msg = caf::make_message(output_atom::value, batch);
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE(!sink(msg));
  caf::message copy;
  caf::binary_deserializer source{sys, buf};
  REQUIRE(!source(copy));
  REQUIRE(copy.match_elements<output_atom, output_batch>());
  auto& got = copy.get_as<output_batch>(1);
  CHECK(got.rank == 3);
  CHECK(got.stream == 1);
  CHECK(got.lines == batch.lines);
}

TEST_CASE("--link-timeout sets CAF's connection timeout and a heartbeat well inside it") {
  auto d = liveness::from_seconds(liveness::default_seconds);
  CHECK(d.timeout == std::chrono::milliseconds{10000});
  CHECK(d.heartbeat == std::chrono::milliseconds{500});
  auto one = liveness::from_seconds(1);
  CHECK(one.timeout == std::chrono::milliseconds{1000});
  CHECK(one.heartbeat == std::chrono::milliseconds{166});
  CHECK(liveness::from_seconds(2.5).timeout == std::chrono::milliseconds{2500});
  for (double bad : {0.0, 0.5, -3.0, 3601.0, std::nan("")})
    CHECK_THROWS_WITH_AS(liveness::from_seconds(bad),
                         doctest::Contains("--link-timeout"), std::invalid_argument);
}

namespace {

// What a colocator answers to its first request (node_atom) from `self` (its driver): its
// node, or the error.
std::string node_answer(fixture& f, caf::scoped_actor& self, colocator_actor c) {
  self->send(c, node_atom::value);
  f.sched.run();
  std::string out = "no answer";
  self->receive([&](node_info& info) { out = "node " + info.name; },
                [&](caf::error& e) { out = f.sys.render(e); },
                caf::after(std::chrono::seconds(0)) >> [] {});
  return out;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "an agent with credentials runs nothing for a spawn without a driver's "
                           "ticket for that agent and job") {
  char tmpl[] = "/tmp/caf-hvd-ticket-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  auto& net = net::module();
  net.init_cluster(dir + "/c");
  auto alice_dir = net.issue_credentials(dir + "/c", cert_role::driver, "alice", "");
  auto joiner_dir = net.issue_credentials(dir + "/c", cert_role::node, "h2", "");
  cfg.node->name = "ha";
  cfg.node->creds = net.load_cluster(dir + "/c", cert_role::node);
  auto alice = net.load_cluster(alice_dir, cert_role::driver);
  // the audience: this agent's node id and its own certificate, as the driver's
  // connection saw it
  auto me = colocator_audience(to_string(sys.node()), net.own_certificate(*cfg.node->creds));
  auto other_agent = colocator_audience(
      to_string(sys.node()), net.own_certificate(net.load_cluster(joiner_dir, cert_role::node)));
  auto now = static_cast<long>(::time(nullptr));
  caf::scoped_actor self{sys};
  auto driver = caf::actor_cast<driver_actor>(self);
  auto spawn = [&](const std::string& job, signed_ticket t) {
    return sys.spawn(colocator_fn, driver, coordinator_actor{}, job, int32_t{1000}, std::move(t));
  };
  // CAF lets any connected peer spawn: one without a ticket, a joining agent's node key,
  // a driver's ticket for another agent or another job
  auto none = node_answer(*this, self, spawn("job-1", signed_ticket{}));
  CHECK(none.find("node agent 'ha' refused to run job job-1 for this peer") != std::string::npos);
  CHECK(none.find("the ticket carries no certificate") != std::string::npos);
  auto by_node = node_answer(
      *this, self, spawn("job-1", net.sign_ticket(net.load_cluster(joiner_dir, cert_role::node),
                                            ticket_body("colocator", me, "job-1", now))));
  CHECK(by_node.find("its certificate 'h2' is a node certificate, not a driver one")
        != std::string::npos);
  auto elsewhere = node_answer(
      *this, self, spawn("job-1", net.sign_ticket(alice, ticket_body("colocator", "other#1", "job-1", now))));
  CHECK(elsewhere.find("not for colocator at") != std::string::npos);
  // a ticket for this node id but made for another agent's certificate (a peer that
  // claimed this agent's node id to its driver)
  auto other_cert = node_answer(
      *this, self, spawn("job-1", net.sign_ticket(alice, ticket_body("colocator", other_agent,
                                                                     "job-1", now))));
  CHECK(other_cert.find("not for colocator at") != std::string::npos);
  auto other_job =
      node_answer(*this, self, spawn("job-1", net.sign_ticket(alice, ticket_body("colocator", me,
                                                                           "job-2", now))));
  CHECK(other_job.find("it names job 'job-2'") != std::string::npos);
  {
    // what a driver asks next gets the refusal too: no worker, no launch
    auto refused = spawn("job-1", signed_ticket{});
    self->send(refused, workers_atom::value, std::vector<uint32_t>{0}, uint32_t{0});
    sched.run();
    size_t workers = 99;
    self->receive([&](std::vector<worker_actor>& ws) { workers = ws.size(); },
                  caf::after(std::chrono::seconds(0)) >> [] {});
    CHECK(workers == 0);
    launch_batch b;
    b.argv = {"/usr/bin/touch", "/tmp/never"};
    b.slots = {0};
    b.envs = {{}};
    self->send(refused, launch_atom::value, b);
    sched.run();
    std::string launch = "no answer";
    self->receive([&](std::vector<int32_t>&) { launch = "launched"; },
                  [&](caf::error& e) { launch = sys.render(e); },
                  caf::after(std::chrono::seconds(0)) >> [] {});
    CHECK(launch.find("refused to run job job-1") != std::string::npos);
  }
  CHECK(cfg.node->jobs->snapshot().empty()); // none of them counts as a job here
  // alice's own ticket for this agent and job: the colocator serves, the job shows
  auto ok = spawn("job-1", net.sign_ticket(alice, ticket_body("colocator", me, "job-1", now)));
  CHECK(node_answer(*this, self, ok) == "node ha");
  auto jobs = cfg.node->jobs->snapshot();
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].job == "job-1");
  CHECK(jobs[0].owner == "alice");
  self->send(ok, terminate_atom::value, int32_t{0});
  caf::anon_send_exit(ok, caf::exit_reason::user_shutdown);
  sched.run();
  sched.trigger_timeouts();
  sched.run();
  std::filesystem::remove_all(dir);
}

TEST_CASE_FIXTURE(fixture, "a colocator obeys only its driver, its agent and itself: a stranger "
                           "gets refusals and starts, signals and learns nothing") {
  cfg.node->name = "sc";
  cfg.node->guardian = spawn_guardian(sys);
  caf::scoped_actor driver{sys};
  caf::scoped_actor stranger{sys}; // another user's driver, a node, any actor of a peer
  auto colocator = sys.spawn(colocator_fn, caf::actor_cast<driver_actor>(driver),
                             coordinator_actor{}, std::string{"job"}, int32_t{1000},
                             signed_ticket{});
  auto log = std::make_shared<worker_log>();
  auto worker = sys.spawn(fake_worker, log);
  caf::send_as(worker, colocator, enlist_atom::value, worker);
  sched.run();
  auto marker = std::filesystem::temp_directory_path()
                / ("caf-hvd-stranger-" + std::to_string(::getpid()));
  auto answer = [&](caf::scoped_actor& who) {
    sched.run();
    std::string out = "no answer";
    who->receive([&](node_info& i) { out = "node " + i.name; },
                 [&](std::vector<worker_actor>& ws) { out = std::to_string(ws.size()) + " workers"; },
                 [&](std::vector<int32_t>& pids) { out = std::to_string(pids.size()) + " pids"; },
                 [&](int32_t port) { out = "port " + std::to_string(port); },
                 [&](gpu_lease&) { out = "a lease"; },
                 [&](gloo_abort_report&) { out = "an abort report"; },
                 [&](caf::error& e) { out = sys.render(e); },
                 caf::after(std::chrono::seconds(0)) >> [] {});
    return out;
  };
  auto refused = [](const std::string& a) { return a.find("refused") != std::string::npos; };
  stranger->send(colocator, node_atom::value);
  CHECK(refused(answer(stranger)));
  stranger->send(colocator, workers_atom::value, std::vector<uint32_t>{0}, uint32_t{0});
  CHECK(refused(answer(stranger)));
  launch_batch b;
  b.argv = {"/usr/bin/touch", marker.string()};
  b.slots = {0};
  b.envs = {{}};
  stranger->send(colocator, launch_atom::value, b);
  CHECK(refused(answer(stranger)));
  stranger->send(colocator, port_atom::value);
  CHECK(refused(answer(stranger)));
  stranger->send(colocator, gpu_atom::value, uint32_t{1});
  CHECK(refused(answer(stranger)));
  stranger->send(colocator, abort_atom::value, std::vector<uint32_t>{0},
                 std::vector<std::string>{"127.0.0.1:1"}, std::vector<std::string>{});
  CHECK(refused(answer(stranger)));
  stranger->send(colocator, call_atom::value, uint64_t{1}, uint32_t{0}, std::string{"payload"},
                 std::vector<uint32_t>{0});
  stranger->send(colocator, terminate_atom::value, int32_t{0});
  stranger->send(colocator, stop_atom::value, std::string{"forged stop"});
  stranger->send(colocator, kill_atom::value);
  stranger->send(colocator, drain_atom::value, true, std::string{"forged drain"});
  stranger->send(colocator, cancel_atom::value, std::string{"job"}, std::string{},
                 std::string{"forged"});
  caf::anon_send(colocator, cancel_atom::value, std::string{"job"}, std::string{},
                 std::string{"forged"});
  caf::anon_send(colocator, terminate_atom::value, int32_t{0});
  caf::anon_send(colocator, stop_atom::value, std::string{"forged stop"});
  sched.run();
  sched.trigger_timeouts();
  sched.run();
  CHECK(log->signals.empty());
  CHECK(log->stops.empty());
  CHECK(log->calls == 0);
  CHECK_FALSE(std::filesystem::exists(marker));
  std::string drained = "nothing";
  driver->receive([&](drain_atom, std::string&, bool, std::string&) { drained = "a drain"; },
                  caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(drained == "nothing");
  std::string cancelled = "nothing";
  driver->receive([&](cancel_atom, std::string&, std::string&) { cancelled = "a cancel"; },
                  caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(cancelled == "nothing");
  // a stranger's worker cannot enlist to be signalled in the job's name ...
  auto log2 = std::make_shared<worker_log>();
  auto foreign = sys.spawn(fake_worker, log2);
  stranger->send(colocator, enlist_atom::value, foreign);
  sched.run();
  // ... while the driver is obeyed as before
  driver->send(colocator, node_atom::value);
  CHECK(answer(driver) == "node sc");
  driver->send(colocator, terminate_atom::value, int32_t{0});
  sched.run();
  CHECK(log->signals == std::vector<int32_t>{15});
  CHECK(log2->signals.empty());
  sched.trigger_timeouts();
  sched.run();
  caf::anon_send_exit(foreign, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(colocator, caf::exit_reason::user_shutdown);
  post_from(cfg.node->guardian, shutdown_atom::value);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "a worker obeys only its colocator and its driver, and takes "
                           "output, exits and frames only from itself: a stranger starts, "
                           "signals and forges nothing") {
  cfg.node->name = "sw";
  cfg.node->shim = CAF_HVD_EXEC;
  caf::scoped_actor colocator{sys}, driver{sys};
  caf::scoped_actor stranger{sys}; // another user's driver, a node, any actor of a peer
  auto worker = sys.spawn(worker_fn, caf::actor_cast<colocator_actor>(colocator.ptr()),
                          caf::actor_cast<driver_actor>(driver.ptr()), coordinator_actor{},
                          uint32_t{3}, std::shared_ptr<const rank_identity>{});
  std::shared_ptr<void> end_it(nullptr, [&](void*) {
    caf::anon_send_exit(worker, caf::exit_reason::kill);
    sched.run();
  });
  sched.run();
  colocator->receive([](enlist_atom, const worker_actor&) {},
                     caf::after(std::chrono::seconds(0)) >> [] { FAIL("the worker did not enlist"); });
  auto dir = std::filesystem::temp_directory_path()
             / ("caf-hvd-worker-stranger-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto forged = dir / "forged", launched = dir / "launched";
  auto spec_writing = [](const std::filesystem::path& f) {
    launch_spec s;
    s.argv = {"/bin/sh", "-c", "touch " + f.string() + "; echo ran"};
    s.env = {"PATH=/usr/bin:/bin"};
    s.cwd = "/";
    return s;
  };
  // What reached the driver, without waiting: exits, output lines, results, logs.
  auto driver_heard = [&] {
    std::vector<std::string> heard;
    bool more = true;
    while (more)
      driver->receive(
          [&](exited_atom, rank_exit& ex) { heard.push_back("exit " + std::to_string(ex.code)); },
          [&](output_atom, output_batch& b) {
            for (auto& l : b.lines)
              heard.push_back("output " + l);
            return caf::ok_atom::value;
          },
          [&](result_atom, uint32_t, uint64_t, std::string& p) { heard.push_back("result " + p); },
          [&](log_atom, uint32_t, std::string& p) {
            heard.push_back("log " + p);
            return caf::ok_atom::value;
          },
          [&](chanfail_atom, uint32_t, std::string& p) { heard.push_back("chanfail " + p); },
          caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
    return heard;
  };
  auto before = refused_messages.load();
  auto r = stranger->request(worker, caf::infinite, launch_atom::value, spec_writing(forged));
  sched.run();
  std::string answer = "no answer";
  r.receive([&](int32_t pid) { answer = "pid " + std::to_string(pid); },
            [&](caf::error& e) { answer = sys.render(e); });
  CHECK(answer.find("refused") != std::string::npos);
  // everything else a worker takes, from the stranger and without a sender
  auto forge_all = [&](auto send) {
    send(terminate_atom::value, int32_t{9});
    send(stop_atom::value, std::string{"forged stop"});
    send(call_atom::value, uint64_t{1}, uint32_t{0}, std::string{"payload"});
    send(close_atom::value);
    send(result_atom::value, uint64_t{1}, std::string{"forged result"});
    send(log_atom::value, std::string{"forged log"});
    send(chanend_atom::value, std::string{"forged channel end"});
    send(deadline_atom::value, uint64_t{1});
    send(output_atom::value, output_batch{3, 0, {"forged output"}});
    send(exited_atom::value, rank_exit{3, "sw", 0, 0, "", "forged"});
  };
  forge_all([&](auto... xs) { stranger->send(worker, xs...); });
  forge_all([&](auto... xs) { caf::anon_send(worker, xs...); });
  sched.run();
  sched.trigger_timeouts();
  sched.run();
  CHECK(refused_messages.load() == before + 21);
  CHECK(driver_heard().empty());
  CHECK_FALSE(std::filesystem::exists(forged));
  // ... while its colocator's launch runs, and the rank's own output and exit reach the
  // driver (the worker acted on nothing of the stranger's: it is still unlaunched)
  r = colocator->request(worker, caf::infinite, launch_atom::value, spec_writing(launched));
  sched.run();
  r.receive([&](int32_t pid) { answer = "pid " + std::to_string(pid); },
            [&](caf::error& e) { answer = sys.render(e); });
  CHECK(answer.rfind("pid ", 0) == 0);
  std::vector<std::string> heard;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::find(heard.begin(), heard.end(), "exit 0") == heard.end()
         && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    sched.run();
    for (auto& h : driver_heard())
      heard.push_back(h);
  }
  CHECK(heard == std::vector<std::string>{"output ran", "exit 0"});
  CHECK(std::filesystem::exists(launched));
  CHECK_FALSE(std::filesystem::exists(forged));
  std::filesystem::remove_all(dir);
}

TEST_CASE_FIXTURE(fixture, "the cluster's table takes a join only from the joiner it names, and "
                           "a member's news and leaving only from that joiner") {
  cfg.node->name = "holder";
  auto table = spawn_cluster_table(sys, "");
  sched.run();
  caf::scoped_actor joiner{sys}, stranger{sys};
  member_info info;
  info.name = "h1";
  info.address = "10.0.0.1";
  info.port = 7077;
  info.slots = 2;
  auto join = [&](caf::scoped_actor& asking, caf::actor named) {
    auto r = asking->request(table, caf::infinite, join_atom::value, named, info, signed_ticket{});
    sched.run();
    join_answer got;
    r.receive([&](join_answer& a) { got = a; },
              [&](caf::error& e) { FAIL(sys.render(e)); });
    return got;
  };
  auto slots_of_h1 = [&]() -> int {
    auto r = stranger->request(table, caf::infinite, table_atom::value, signed_ticket{});
    sched.run();
    int slots = -1;
    r.receive(
        [&](cluster_view& v) {
          for (auto& n : v.nodes)
            if (n.info.name == "h1" && n.state == "alive")
              slots = static_cast<int>(n.info.slots);
        },
        [&](caf::error& e) { FAIL(sys.render(e)); });
    return slots;
  };
  auto before = refused_messages.load();
  // a peer that names another's joiner (to have that one's link count as the member's)
  auto forged = join(stranger, caf::actor{joiner.ptr()});
  CHECK(forged.error == "the joiner named is not the actor that asks");
  CHECK(forged.token == 0);
  CHECK(slots_of_h1() == -1);
  auto joined = join(joiner, caf::actor{joiner.ptr()});
  REQUIRE(joined.error.empty());
  CHECK(slots_of_h1() == 2);
  // the member's token in a stranger's message (or one without a sender) changes nothing
  auto changed = info;
  changed.slots = 9;
  stranger->send(table, update_atom::value, joined.token, changed);
  caf::anon_send(table, update_atom::value, joined.token, changed);
  stranger->send(table, left_atom::value, joined.token, std::string{"h1"});
  sched.run();
  CHECK(slots_of_h1() == 2);
  CHECK(refused_messages.load() == before + 4);
  // its own joiner's news and leaving count
  joiner->send(table, update_atom::value, joined.token, changed);
  sched.run();
  CHECK(slots_of_h1() == 9);
  joiner->send(table, left_atom::value, joined.token, std::string{"h1"});
  sched.run();
  CHECK(slots_of_h1() == -1);
  caf::anon_send_exit(table, caf::exit_reason::user_shutdown);
  sched.run();
}
