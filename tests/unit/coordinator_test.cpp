// The coordinator actor on CAF's deterministic test scheduler (one thread, virtual time):
// workers' registrations, assignments over varied layouts, the barrier and its
// deadlines, heard by a fake job that records what the coordinator tells it.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <caf/scheduler/test_coordinator.hpp>
#include <fmt/format.h>

#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "actors/coordinator.hpp"
#include "actors/protocol.hpp"

using namespace cafhvd;

namespace {

struct heard {
  std::vector<uint64_t> complete;
  std::vector<std::string> rejoins;
  std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> late;
  std::vector<std::string> events;
};

// The job: what the coordinator tells it, recorded; and the job's requests the tests
// make, relayed (the coordinator takes them from its job only).
caf::behavior fake_job(caf::event_based_actor* self, std::shared_ptr<heard> h,
                       std::shared_ptr<coordinator_full_actor> coord) {
  auto relay = [=](auto answer, auto... xs) {
    using value = decltype(answer);
    auto rp = self->make_response_promise<value>();
    self->request(*coord, caf::infinite, xs...)
        .then([rp](value& x) mutable { rp.deliver(std::move(x)); },
              [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
    return rp;
  };
  return {
      [=](complete_atom, uint64_t g) { h->complete.push_back(g); },
      [=](rejoin_atom, std::string& key) { h->rejoins.push_back(key); },
      [=](late_atom, uint64_t, std::vector<std::string>& fresh,
          std::vector<std::string>& carrying) { h->late.emplace_back(fresh, carrying); },
      [](notified_atom, uint64_t, std::string&, std::string&) {},
      [](reached_atom, uint64_t, std::string&, bool, bool) {},
      [](parked_atom, uint64_t, std::string&) {},
      [](tstore_atom, std::string&) {},
      [=](event_atom, std::string& name, std::string&) { h->events.push_back(name); },
      [=](expect_atom a, std::vector<uint32_t>& ids, std::string& host, caf::node_id& node) {
        return relay(std::vector<std::string>{}, a, ids, host, node);
      },
      [=](assign_atom a, std::vector<host_slots>& hosts, int32_t min_np, int32_t max_np) {
        return relay(assignment{}, a, hosts, min_np, max_np);
      },
  };
}

struct test_config : hvd_config {
  test_config() { set("scheduler.policy", caf::atom("testing")); }
};

struct fixture {
  test_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<heard> h = std::make_shared<heard>();
  coordinator_full_actor coord;
  coordinator_client_actor job;
  caf::actor job_relay; // the job's untyped handle: it relays the tests' requests

  explicit fixture(std::chrono::milliseconds elastic_timeout = std::chrono::seconds(600)) {
    coordinator_config c;
    c.elastic = true;
    c.torch_store = torch_store_mode::off;
    c.start_timeout = std::chrono::seconds(30);
    c.elastic_timeout = elastic_timeout;
    auto ref = std::make_shared<coordinator_full_actor>();
    job_relay = sys.spawn(fake_job, h, ref);
    job = caf::actor_cast<coordinator_client_actor>(job_relay);
    coord = *ref = spawn_coordinator(sys, c, job);
    sched.run();
  }
  ~fixture() {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(job, caf::exit_reason::user_shutdown);
    sched.run();
  }

  template <class T, class... Ts> T ask(Ts&&... xs) {
    caf::scoped_actor self{sys};
    auto r = self->request(job_relay, caf::infinite, std::forward<Ts>(xs)...);
    sched.run();
    T out{};
    bool got = false;
    r.receive(
        [&](T& x) {
          out = std::move(x);
          got = true;
        },
        [&](caf::error& e) { FAIL("coordinator answered an error: " << sys.render(e)); });
    REQUIRE(got);
    return out;
  }

  void report(uint32_t slot, const std::string& host) {
    caf::send_as(job, coord, report_atom::value, slot, host); // as a worker of this node
    sched.run();
  }
  // The job tells the coordinator something.
  template <class... Ts> void tell(Ts&&... xs) {
    caf::send_as(job, coord, std::forward<Ts>(xs)...);
    sched.run();
  }
  void vote(const std::string& host, int lr) {
    post_from(coord, vote_atom::value, host, int32_t{lr});
    sched.run();
  }

  // The registration answer for `ids` on `host`, after `between` ran.
  std::vector<std::string> expect(const std::vector<uint32_t>& ids, const std::string& host,
                                  const std::function<void()>& between,
                                  std::optional<caf::node_id> node = std::nullopt) {
    caf::scoped_actor self{sys};
    auto r = self->request(job_relay, caf::infinite, expect_atom::value, ids, host,
                           node ? *node : sys.node());
    sched.run();
    between();
    sched.run();
    std::vector<std::string> out;
    bool got = false;
    r.receive(
        [&](std::vector<std::string>& x) {
          out = std::move(x);
          got = true;
        },
        [&](caf::error& e) { FAIL(sys.render(e)); });
    CHECK(got);
    return out;
  }
};

// Join deadlines are checked against the real clock: a short elastic timeout.
struct short_deadline : fixture {
  short_deadline() : fixture(std::chrono::milliseconds(20)) {}
};

slot_info row(const std::string& host, int rank, int lr, int ls, int cr, int cs, int size) {
  slot_info s;
  s.hostname = host;
  s.rank = rank;
  s.local_rank = lr;
  s.local_size = ls;
  s.cross_rank = cr;
  s.cross_size = cs;
  s.size = size;
  return s;
}

barrier_spec spec(uint64_t n, std::vector<slot_info> plan, std::vector<std::string> fresh,
                  std::vector<std::string> carried, bool now = false) {
  barrier_spec b;
  b.number = n;
  b.plan = std::move(plan);
  b.fresh = std::move(fresh);
  for (auto& key : carried)
    b.carried.push_back({key, key.substr(0, key.find(':')),
                         std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count(),
                         1});
  b.update = "generation " + std::to_string(n) + "\n";
  b.release_now = now;
  return b;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "coordinator: workers that report their host are registered") {
  auto got = expect({3, 4}, "a", [&] {
    report(3, "a");
    report(4, "a");
  });
  CHECK(got == std::vector<std::string>{"", ""});
}

TEST_CASE_FIXTURE(fixture, "coordinator: a report of a slot nobody waits for leaves nothing "
                           "behind") {
  // The job asks for a batch before its colocator spawns a worker: a report that comes
  // first is made up (or late), and must not stand in for the worker's own.
  report(7, "b");
  auto got = expect({7}, "b", [&] { sched.trigger_timeouts(); });
  CHECK(got == std::vector<std::string>{"its worker did not report its host within 30 s "
                                        "(--start-timeout)"});
}

TEST_CASE_FIXTURE(fixture, "coordinator: a report counts only from the node of the slot's "
                           "colocator") {
  auto before = refused_messages.load();
  auto elsewhere = caf::make_node_id(4242, "0123456789012345678901234567890123456789");
  REQUIRE(elsewhere);
  // Slot 8's colocator runs on another node: this node's report of it is refused, and the
  // slot is named as silent at the deadline (not as registered).
  auto got = expect({8}, "a", [&] {
    report(8, "a");
    sched.trigger_timeouts();
  }, *elsewhere);
  CHECK(got == std::vector<std::string>{"its worker did not report its host within 30 s "
                                        "(--start-timeout)"});
  CHECK(refused_messages.load() == before + 1);
  // An anonymous report is refused too.
  got = expect({9}, "a", [&] {
    caf::anon_send(coord, report_atom::value, uint32_t{9}, std::string{"a"});
    sched.run();
    sched.trigger_timeouts();
  });
  CHECK(got == std::vector<std::string>{"its worker did not report its host within 30 s "
                                        "(--start-timeout)"});
  CHECK(refused_messages.load() == before + 2);
}

TEST_CASE_FIXTURE(fixture, "coordinator: the job's messages are taken from the job only") {
  auto before = refused_messages.load();
  // A stranger's requests are answered with a refusal, not with the job's data.
  auto refusal = [&](auto answer, auto... xs) {
    using value = decltype(answer);
    caf::scoped_actor stranger{sys};
    auto r = stranger->request(coord, caf::infinite, xs...);
    sched.run();
    std::string said;
    r.receive([&](value&) { said = "an answer with the job's data"; },
              [&](caf::error& e) { said = sys.render(e); });
    return said;
  };
  auto no_right = "refused, the sender has no right to it";
  CHECK_MESSAGE(refusal(assignment{}, assign_atom::value, std::vector<host_slots>{{"a", 1}},
                        int32_t{1}, int32_t{1})
                        .find(no_right)
                    != std::string::npos,
                "assign");
  CHECK(refusal(std::vector<std::string>{}, expect_atom::value, std::vector<uint32_t>{1},
                std::string{"a"}, sys.node())
            .find(no_right)
        != std::string::npos);
  CHECK(refusal(gloo_links{}, gloo_atom::value).find(no_right) != std::string::npos);
  CHECK(refusal(uint16_t{}, lot_atom::value, uint64_t{1}).find(no_right) != std::string::npos);
  CHECK(refusal(served{}, serve_atom::value, std::string{"127.0.0.1"}).find(no_right)
        != std::string::npos);
  CHECK(refused_messages.load() == before + 5);
  // A stranger's barrier and release do not form a generation: the job's own do.
  std::vector<slot_info> plan{row("a", 0, 0, 1, 0, 2, 2), row("b", 1, 0, 1, 1, 2, 2)};
  caf::anon_send(coord, barrier_atom::value, spec(2, plan, {}, {"a:0", "b:0"}));
  sched.run();
  vote("a", 0);
  vote("b", 0);
  CHECK(h->complete.empty());
  tell(barrier_atom::value, spec(2, plan, {}, {"a:0", "b:0"}));
  vote("a", 0);
  vote("b", 0);
  CHECK(h->complete == std::vector<uint64_t>{2});
  CHECK(refused_messages.load() == before + 6);
  // Each refusal is counted per peer and told to the process's listener (a driver's event
  // log): here a message without a sender (a peer's anonymous one looks the same).
  auto anonymous_before = refused_by_peer()["no sender"];
  std::vector<std::string> told;
  on_refused_message([&](const std::string& peer, const std::string& what, uint64_t count) {
    told.push_back(fmt::format("{}: {} ({})", peer, what, count));
  });
  caf::anon_send(coord, stop_atom::value);
  sched.run();
  on_refused_message({});
  CHECK(told == std::vector<std::string>{fmt::format("no sender: the coordinator refused stop ({})",
                                                     anonymous_before + 1)});
  CHECK(refused_by_peer()["no sender"] == anonymous_before + 1);
}

TEST_CASE_FIXTURE(fixture, "coordinator: a worker on another host than its slot's is named with "
                           "both hosts") {
  auto got = expect({1, 2}, "a", [&] {
    report(1, "a");
    report(2, "z");
  });
  REQUIRE(got.size() == 2);
  CHECK(got[0].empty());
  CHECK(got[1] == "its worker reports host 'z' but the slot was placed on 'a'");
}

TEST_CASE_FIXTURE(fixture, "coordinator: a registration incomplete at its deadline names the "
                           "silent workers only") {
  auto got = expect({5, 6}, "a", [&] {
    report(6, "a");
    sched.trigger_timeouts(); // the start timeout passes; 5 never reported
  });
  REQUIRE(got.size() == 2);
  CHECK(got[0] == "its worker did not report its host within 30 s (--start-timeout)");
  CHECK(got[1].empty());
}

TEST_CASE_FIXTURE(fixture, "coordinator: assignments as Horovod computes them, hosts in the "
                           "given order, uneven slots") {
  auto a =
      ask<assignment>(assign_atom::value, std::vector<host_slots>{{"b", 2}, {"a", 1}, {"c", 3}},
                      int32_t{6}, int32_t{6});
  REQUIRE(a.error.empty());
  // ranks packed per host in the order given; cross rank = the host's index among the
  // hosts that have that local rank
  CHECK(a.plan
        == std::vector<slot_info>{row("b", 0, 0, 2, 0, 3, 6), row("b", 1, 1, 2, 0, 2, 6),
                                  row("a", 2, 0, 1, 1, 3, 6), row("c", 3, 0, 3, 2, 3, 6),
                                  row("c", 4, 1, 3, 1, 2, 6), row("c", 5, 2, 3, 0, 1, 6)});
  // the same hosts in another order: another plan
  auto b =
      ask<assignment>(assign_atom::value, std::vector<host_slots>{{"c", 3}, {"a", 1}, {"b", 2}},
                      int32_t{6}, int32_t{6});
  REQUIRE(b.error.empty());
  CHECK(b.plan.front().hostname == "c");
  CHECK(b.plan[3] == row("a", 3, 0, 1, 1, 3, 6));
  // --max-np caps: hosts after the cap get nothing
  auto c = ask<assignment>(assign_atom::value, std::vector<host_slots>{{"a", 2}, {"b", 2}},
                           int32_t{1}, int32_t{3});
  REQUIRE(c.plan.size() == 3);
  CHECK(c.plan[2] == row("b", 2, 0, 1, 1, 2, 3));
  // too few slots: the reason, no plan
  auto d = ask<assignment>(assign_atom::value, std::vector<host_slots>{{"a", 1}}, int32_t{2},
                           int32_t{0});
  CHECK(d.plan.empty());
  CHECK(!d.error.empty());
}

TEST_CASE_FIXTURE(fixture, "coordinator: a generation completes with the last vote of the "
                           "processes it carries over; fresh slots and strangers do not count") {
  auto plan = std::vector<slot_info>{row("a", 0, 0, 1, 0, 3, 3), row("b", 1, 0, 1, 1, 3, 3),
                                     row("c", 2, 0, 1, 2, 3, 3)};
  tell(barrier_atom::value, spec(2, plan, {"c:0"}, {"a:0", "b:0"}));
  sched.run();
  vote("a", 0);
  vote("c", 0); // fresh: its process starts with the release, it cannot vote
  vote("x", 0); // not in the plan
  CHECK(h->complete.empty());
  vote("b", 0);
  CHECK(h->complete == std::vector<uint64_t>{2});
  // released: a slot that joined it and votes again asks for the next generation
  tell(release_atom::value, uint64_t{2});
  sched.run();
  vote("c", 0);
  CHECK(h->rejoins == std::vector<std::string>{"c:0"});
}

TEST_CASE_FIXTURE(fixture, "coordinator: held votes carry over to the next plan that keeps their "
                           "slots; a slot the job let go no longer counts") {
  auto two = std::vector<slot_info>{row("a", 0, 0, 1, 0, 2, 2), row("b", 1, 0, 1, 1, 2, 2)};
  tell(barrier_atom::value, spec(2, two, {}, {"a:0", "b:0"}));
  sched.run();
  vote("a", 0);
  tell(leave_atom::value, std::string{"b:0"}); // b's host was blacklisted
  sched.run();
  vote("b", 0);
  CHECK(h->complete.empty());
  auto one = std::vector<slot_info>{row("a", 0, 0, 1, 0, 1, 1)};
  tell(barrier_atom::value, spec(3, one, {}, {"a:0"}));
  sched.run();
  CHECK(h->complete == std::vector<uint64_t>{3}); // a's vote was held over
}

TEST_CASE_FIXTURE(short_deadline, "coordinator: join deadlines that pass are reported with the "
                                  "slots that missed them") {
  auto plan = std::vector<slot_info>{row("a", 0, 0, 1, 0, 2, 2), row("b", 1, 0, 1, 1, 2, 2)};
  tell(barrier_atom::value, spec(2, plan, {}, {"a:0", "b:0"}));
  sched.run();
  vote("a", 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  sched.trigger_timeouts(); // the elastic timeout passed; b held state and never came
  sched.run();
  REQUIRE(h->late.size() == 1);
  CHECK(h->late[0].first.empty());
  CHECK(h->late[0].second == std::vector<std::string>{"b:0"});
  CHECK(h->complete.empty());
}

TEST_CASE_FIXTURE(short_deadline, "coordinator: a late slot that holds state is told once, and "
                                  "one its job finds alive is waited for from its last sign of "
                                  "life") {
  auto plan = std::vector<slot_info>{row("a", 0, 0, 1, 0, 2, 2), row("b", 1, 0, 1, 1, 2, 2)};
  tell(barrier_atom::value, spec(2, plan, {}, {"a:0", "b:0"}));
  vote("a", 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  sched.trigger_timeouts();
  sched.run();
  REQUIRE(h->late.size() == 1);
  CHECK(h->late[0].second == std::vector<std::string>{"b:0"});
  // told once: the job is asking b's worker whether it is alive
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  sched.trigger_timeouts();
  sched.run();
  CHECK(h->late.size() == 1);
  // b's worker: alive just now. Its deadline is the elastic timeout from now, not from
  // the generation's start, which passed long ago
  tell(alive_atom::value, uint64_t{2}, std::string{"b:0"}, uint32_t{0});
  sched.trigger_timeouts();
  sched.run();
  CHECK(h->late.size() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  sched.trigger_timeouts();
  sched.run();
  REQUIRE(h->late.size() == 2); // silent for the elastic timeout since: late again
  CHECK(h->late[1].second == std::vector<std::string>{"b:0"});
  // a sign of life for another generation, or of a slot it does not carry, re-arms nothing
  tell(alive_atom::value, uint64_t{1}, std::string{"b:0"}, uint32_t{0});
  tell(alive_atom::value, uint64_t{2}, std::string{"c:0"}, uint32_t{0});
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  sched.trigger_timeouts();
  sched.run();
  CHECK(h->late.size() == 2);
  // alive again, and it comes: the generation completes
  tell(alive_atom::value, uint64_t{2}, std::string{"b:0"}, uint32_t{0});
  vote("b", 0);
  CHECK(h->complete == std::vector<uint64_t>{2});
}

TEST_CASE_FIXTURE(fixture, "coordinator: after stop no generation completes") {
  auto plan = std::vector<slot_info>{row("a", 0, 0, 1, 0, 1, 1)};
  tell(barrier_atom::value, spec(2, plan, {}, {"a:0"}));
  tell(stop_atom::value);
  sched.run();
  vote("a", 0);
  CHECK(h->complete.empty());
}
