// The lifecycle's rules as values: a generation, join deadlines of fresh processes and
// of processes that hold state, and which ranks carry the state into a new plan.
#include <doctest/doctest.h>

#include "runtime/job/generation.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

namespace {

std::vector<slot_info> plan_of(std::vector<host_slots> hs) {
  return get_host_assignments(hs, 1, std::nullopt);
}

const job_clock::time_point t0{};

} // namespace

TEST_CASE("a generation is a printable value: plan, votes, release") {
  generation g{2, plan_of({{"a", 2}, {"b", 1}}), t0};
  CHECK(g.rows.size() == 3);
  CHECK(g.hosts() == std::vector<std::string>{"a", "b"});
  CHECK(g.missing() == std::vector<std::string>{"a:0", "a:1", "b:0"});
  g.votes = {"a:1", "b:0"};
  CHECK_FALSE(g.complete());
  CHECK(g.missing() == std::vector<std::string>{"a:0"});
  CHECK(g.describe() == "generation 2 (forming): 3 ranks, votes 2/3, 0 fresh, hosts a,b");
  g.votes.insert("a:0");
  CHECK(g.complete());
}

TEST_CASE("fresh slots of a plan never vote: the plan is complete without them") {
  generation g{3, plan_of({{"a", 1}, {"b", 1}, {"c", 2}}), t0};
  g.fresh = {"c:0", "c:1"};
  CHECK(g.missing() == std::vector<std::string>{"a:0", "b:0"});
  g.votes = {"a:0"};
  CHECK_FALSE(g.complete());
  g.votes.insert("b:0");
  CHECK(g.complete());
  CHECK(g.describe() == "generation 3 (forming): 4 ranks, votes 2/2, 2 fresh, hosts a,b,c");
}

TEST_CASE(
    "join deadlines: fresh processes get --start-timeout, state holders the elastic timeout") {
  auto start = 30s, elastic = 600s;
  SUBCASE("generation 1: unbounded until someone waits in the barrier") {
    generation g{1, plan_of({{"a", 2}}), t0};
    slot_process p{"a:1", "a", t0 + 1s, 0, true};
    CHECK(deadline_for(g, p, start, elastic).kind == deadline_kind::none);
    g.first_vote = t0 + 5s;
    auto d = deadline_for(g, p, start, elastic);
    CHECK(d.kind == deadline_kind::fresh);
    CHECK(d.at == t0 + 35s); // from the first vote, not from the job's start
  }
  SUBCASE("later generations: a fresh process from its start or the generation's") {
    generation g{3, plan_of({{"a", 1}, {"b", 1}}), t0 + 100s};
    slot_process fresh{"b:0", "b", t0 + 101s, 0, true};
    CHECK(deadline_for(g, fresh, start, elastic).at == t0 + 131s);
    slot_process waited_long{"b:0", "b", t0 + 50s, 0, true}; // started for an earlier one
    CHECK(deadline_for(g, waited_long, start, elastic).at == t0 + 130s);
  }
  SUBCASE("a process that joined a released generation may be in a long step") {
    generation g{2, plan_of({{"a", 1}, {"b", 1}}), t0 + 100s};
    slot_process carrying{"a:0", "a", t0, 1, true};
    auto d = deadline_for(g, carrying, start, elastic);
    CHECK(d.kind == deadline_kind::carrying);
    CHECK(d.at == t0 + 700s); // never --start-timeout
  }
}

TEST_CASE("the state survives only on a running rank of the last released generation") {
  std::vector<slot_process> procs = {
      {"a:0", "a", t0, 1, true}, // joined generation 1, still running
      {"b:0", "b", t0, 0, true}, // started for generation 2, waits in its barrier
  };
  CHECK(state_carriers(1, procs, {"a", "b"}) == std::vector<std::string>{"a:0"});
  // A's rank is killed before it re-joined: B never held any state.
  procs[0].running = false;
  CHECK(state_carriers(1, procs, {"b"}).empty());
  // Host a left the job while its rank still ran: gone too.
  procs[0].running = true;
  CHECK(state_carriers(1, procs, {"b"}).empty());
  // Generation 2 was released with both: b now carries it as well.
  procs[1].joined = 2;
  CHECK(state_carriers(2, procs, {"b"}) == std::vector<std::string>{"b:0"});
  // a rank that joined only the older generation 1 does not carry generation 2's state
  CHECK(state_carriers(2, procs, {"a"}).empty());
  // nothing released yet: nothing to carry
  CHECK(state_carriers(0, procs, {"a", "b"}).empty());
}

TEST_CASE("a process that never finished a Gloo rendezvous carries no state") {
  // b's process was released into generation 2 but is still inside hvd.init()'s first
  // rendezvous when a's rank dies: it never received the state.
  std::vector<slot_process> procs = {
      {"a:0", "a", t0, 2, false, true},
      {"b:0", "b", t0, 2, true, false},
  };
  CHECK(state_carriers(2, procs, {"a", "b"}).empty());
  // once it finished one, it holds the state it was sent
  procs[1].holds_state = true;
  CHECK(state_carriers(2, procs, {"a", "b"}) == std::vector<std::string>{"b:0"});
}
