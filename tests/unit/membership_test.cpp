// The cluster's membership table: who may hold a name, what status shows, labels and
// addresses as the agents' options take them.
#include <doctest/doctest.h>

#include <filesystem>
#include <stdexcept>
#include <stdlib.h>

#include "runtime/cluster/agent_state.hpp"
#include "runtime/cluster/membership.hpp"

using namespace cafhvd;

namespace {

member_info node(const std::string& name, uint32_t slots = 4) {
  member_info m;
  m.name = name;
  m.address = "10.0.0.1";
  m.port = 7070;
  m.slots = slots;
  return m;
}

ticket_holder cert(const std::string& name, bool shared = false) {
  ticket_holder h;
  h.name = name;
  h.subject = name;
  h.shared = shared;
  return h;
}

} // namespace

TEST_CASE("membership: a name is held by one live agent; a certificate proves its own name only") {
  membership_table t;
  CHECK(t.join(1, node("ha"), cert("ha"), 1000) == "");
  // another agent under a held name
  CHECK(t.join(2, node("ha"), cert("ha"), 1100)
        == "the name 'ha' is held by a live agent at 10.0.0.1:7070; give this agent another "
           "--name, or stop that one");
  // hb's certificate cannot join as hc; a shared certificate (cluster init's) proves no name
  CHECK(t.join(3, node("hc"), cert("hb"), 1200)
        == "its certificate was issued for 'hb', so it cannot join as 'hc'");
  CHECK(t.join(3, node("hc"), cert("node", true), 1200) == "");
  auto v = t.view(1300);
  REQUIRE(v.nodes.size() == 2);
  CHECK(v.nodes[1].shared);
  // ha's link breaks: the name is free for its restarted agent
  CHECK(t.gone(1, false, 2000) == std::vector<std::string>{"ha"});
  CHECK(t.view(2000).nodes[0].state == "lost");
  CHECK(t.alive() == 1);
  CHECK(t.join(4, node("ha"), cert("ha"), 2100) == "");
  CHECK(t.view(2100).nodes[0].state == "alive");
  CHECK(t.view(2100).nodes[0].joined_ms == 2100);
  // updates come only from the member that holds the row
  auto m = node("ha", 8);
  CHECK_FALSE(t.update(1, m, 2200));
  CHECK(t.update(4, m, 2200));
  CHECK(t.view(2200).nodes[0].info.slots == 8);
  CHECK(t.view(2200).nodes[0].last_seen_ms == 2200);
  // gone rows stay for a while, then go
  t.gone(3, true, 3000);
  t.expire(3000 + 500, 1000);
  CHECK(t.view(3500).nodes.size() == 2);
  t.expire(3000 + 1500, 1000);
  CHECK(t.view(4500).nodes.size() == 1);
  // names that are not names never get in
  CHECK(t.join(5, node("bad\x1b[2Jname"), cert("x", true), 5000).find("is not a node name")
        != std::string::npos);
}

TEST_CASE("membership: status shows states, slots in use and where each job's ranks are") {
  membership_table t;
  auto a = node("ha", 4);
  a.labels = {"zone=a"};
  a.jobs = {{"job-1", "alice", 3, {}, 1000}};
  auto b = node("hb", 0);
  b.jobs = {{"job-1", "alice", 1, {}, 1000}, {"job-2", "bob", 2, {0}, 1500}};
  b.gpus = {0, 1};
  b.gpus_free = {1};
  CHECK(t.join(1, a, cert("ha"), 1000) == "");
  CHECK(t.join(2, b, cert("node", true), 1000) == "");
  CHECK(t.join(3, node("hc"), cert("hc"), 1000) == "");
  t.gone(3, false, 2000);
  auto text = render_status(t.view(4000));
  CHECK(text.find("cluster held by '': 2 nodes alive, 6 slots in use of 4 and unlimited")
        != std::string::npos);
  CHECK(text.find("ha    alive                10.0.0.1:7070  3/4 used") != std::string::npos);
  CHECK(text.find("hb    alive (shared cert)  10.0.0.1:7070  3 used, no limit  1/2 used")
        != std::string::npos);
  CHECK(text.find("lost 2.0s ago") != std::string::npos);
  CHECK(text.find("job-1  alice  4      ha:3,hb:1") != std::string::npos);
  CHECK(text.find("job-2  bob    2      hb:2") != std::string::npos);
  auto j = status_json(t.view(4000));
  CHECK(j["nodes"][0]["slots_used"] == 3);
  CHECK(j["nodes"][2]["state"] == "lost");
  CHECK(j["nodes"][1]["jobs"][1]["gpus"][0] == 0);
}

TEST_CASE("membership: a node undrained through the table shows alive at once, before its "
          "next report; one that drains itself stays draining") {
  membership_table t;
  auto a = node("ha", 4);
  a.draining = true; // the agent reported its drain (the administrator's, through the table)
  CHECK(t.join(1, a, cert("ha"), 1000) == "");
  CHECK(t.set_drained("ha", true) == "");
  CHECK(status_json(t.view(2000))["nodes"][0]["state"] == "drained");
  CHECK(t.set_drained("ha", false) == "");
  CHECK(status_json(t.view(2000))["nodes"][0]["state"] == "alive");
  // a node whose agent still says it drains (it refused the undrain) shows it again
  CHECK(t.update(1, a, 2500));
  CHECK(status_json(t.view(3000))["nodes"][0]["state"] == "drained");
}

TEST_CASE("membership: labels and cluster addresses as the options take them") {
  CHECK(parse_labels({"zone=b", "gpu=a100", "k8s.io/pool=x:1"})
        == std::vector<std::string>{"gpu=a100", "k8s.io/pool=x:1", "zone=b"});
  CHECK(parse_labels({"empty="}) == std::vector<std::string>{"empty="});
  CHECK_THROWS_WITH_AS(parse_labels({"novalue"}), doctest::Contains("give KEY=VALUE"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_labels({"=x"}), doctest::Contains("give KEY=VALUE"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_labels({"a=b c"}), doctest::Contains("no spaces"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_labels({"a=1", "a=2"}), doctest::Contains("given twice"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_labels({"a\x1b=1"}), doctest::Contains("a\\x1b=1"),
                       std::invalid_argument);
  auto a = parse_cluster_address("head.example", 7070);
  CHECK(a.host == "head.example");
  CHECK(a.port == 7070);
  a = parse_cluster_address("10.0.0.1:7101", 7070);
  CHECK(a.port == 7101);
  CHECK_THROWS_AS(parse_cluster_address("10.0.0.1:0", 7070), std::invalid_argument);
  CHECK_THROWS_AS(parse_cluster_address("10.0.0.1:http", 7070), std::invalid_argument);
  CHECK_THROWS_AS(parse_cluster_address(":7070", 7070), std::invalid_argument);
  CHECK_THROWS_AS(parse_cluster_address("a b", 7070), std::invalid_argument);
}

namespace {

member_info with_jobs(member_info m, std::vector<job_summary> jobs) {
  m.jobs = std::move(jobs);
  return m;
}

placement_request job(const std::string& id, uint32_t np, bool spread = false,
                      std::vector<std::string> labels = {}) {
  placement_request r;
  r.job = id;
  r.np = np;
  r.spread = spread;
  r.labels = std::move(labels);
  r.hold_ms = 30000;
  return r;
}

std::string where(const placement& p) {
  std::string out;
  for (auto& h : p.hosts)
    out += (out.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return p.error.empty() ? p.waiting ? "waiting for " + p.waiting_for : out : "error: " + p.error;
}

} // namespace

TEST_CASE("placement: packed or spread over free slots, held until the agents report the "
          "ranks, first come first served") {
  membership_table t;
  auto b = node("hb", 2);
  b.labels = {"zone=b"};
  CHECK(t.join(1, node("ha", 2), cert("ha"), 0) == "");
  CHECK(t.join(2, b, cert("hb"), 0) == "");
  CHECK(t.join(3, node("hc", 4), cert("hc"), 0) == "");
  CHECK(where(t.place(job("j1", 4), 1000)) == "hc:4"); // packed: the fewest nodes
  CHECK(where(t.place(job("j1", 4), 1100)) == "hc:4"); // asked again: the same answer
  // j1's slots are held before its agent reports them: j2 gets the others only
  CHECK(where(t.place(job("j2", 3, true), 1200)) == "ha:2,hb:1");
  CHECK(where(t.place(job("j3", 2), 1300))
        == "waiting for 2 slots: 1 free of 8, 4 held by job j1, 3 held by job j2");
  // j4 asks later and fits, but j3 asked first
  CHECK(where(t.place(job("j4", 1), 1400))
        == "waiting for 1 slot: 1 free of 8, 4 held by job j1, 3 held by job j2, 1 job asked "
           "first");
  // the agents report j1's ranks (the hold becomes theirs), then j1 ends: its slots are free
  t.update(3, with_jobs(node("hc", 4), {{"j1", "alice", 4, {}, 1000}}), 1500);
  CHECK(where(t.place(job("j3", 2), 1600)).find("4 held by job j1") != std::string::npos);
  t.update(3, node("hc", 4), 2000);
  CHECK(where(t.place(job("j3", 2), 2100)) == "hc:2");
  CHECK(where(t.place(job("j4", 1), 2200)) == "hc:1");
  // j2's driver is gone before its ranks ran: what was held for it is free again
  t.release("j2");
  CHECK(where(t.place(job("j5", 2, false, {"zone=b"}), 2300)) == "hb:2");
  t.release("j5");
  CHECK(where(t.place(job("j6", 3, false, {"zone=b"}), 2400))
        == "error: the cluster's live nodes labelled zone=b have 2 slots in all; -np 3 cannot fit");
  CHECK(where(t.place(job("j7", 1, false, {"zone=x"}), 2400))
        == "error: the cluster has no live node labelled zone=x to place on");
  // a job that stops asking loses its place in line
  CHECK(where(t.place(job("j8", 8), 3000)).rfind("waiting for 8 slots", 0) == 0);
  CHECK(where(t.place(job("j9", 1), 3100)).find("1 job asked first") != std::string::npos);
  CHECK(where(t.place(job("j9", 1), 9000)) == "ha:1");
  // holds run out if the job's ranks never show (its driver vanished before connecting)
  CHECK(where(t.place(job("j10", 8), 9100)).rfind("waiting", 0) == 0);
  CHECK(where(t.place(job("j10", 8), 9000 + 30000 + 200)).find("held by job j9") ==
        std::string::npos);
}

TEST_CASE("placement: CPUs and GPUs per rank count as Ray's discovery counts them; an elastic "
          "job's own ranks and devices stay its own") {
  membership_table t;
  auto gpu = node("g1", 8);
  gpu.cpus = 8;
  gpu.gpus = {0, 1, 2, 3};
  gpu.gpus_free = {0, 1, 2, 3};
  auto cpu = node("c1", 0); // no --slots: one slot per processor
  cpu.cpus = 16;
  CHECK(t.join(1, gpu, cert("g1"), 0) == "");
  CHECK(t.join(2, cpu, cert("c1"), 0) == "");
  auto needs = [](placement_request r, uint32_t cpus, uint32_t gpus) {
    r.cpus_per_slot = cpus;
    r.gpus_per_slot = gpus;
    return r;
  };
  // 2 GPUs a rank: only g1, and only 2 ranks there
  CHECK(where(t.place(needs(job("a", 3), 0, 2), 1000))
        == "error: the cluster's live nodes fit 2 ranks (2 GPUs each) in all; -np 3 cannot fit");
  CHECK(where(t.place(needs(job("a", 1), 0, 2), 1000)) == "g1:1");
  // a's rank holds 2 GPUs until its agent reports it: b finds 1 rank's worth left
  CHECK(where(t.place(needs(job("b", 2), 0, 2), 1100))
        == "waiting for 2 slots (2 GPUs each): 1 free of 2, 1 held by job a");
  t.release("b");
  // 4 CPUs a rank: c1 fits 4, g1 fits 1 (8 CPUs, a's rank counts 1 CPU... it asked for none)
  CHECK(where(t.place(needs(job("c", 5), 4, 0), 1200)) == "c1:4,g1:1");
  // the agents report a (its 2 devices lent) and c: nothing of 4 CPUs fits now
  t.update(1, with_jobs([&] { auto g = gpu; g.gpus_free = {2, 3}; return g; }(),
                        {{"a", "alice", 1, {0, 1}, 1000}, {"c", "bob", 1, {}, 1200}}),
           1300);
  t.update(2, with_jobs(cpu, {{"c", "bob", 4, {}, 1200}}), 1300);
  CHECK(where(t.place(needs(job("d", 1), 4, 0), 1400))
        == "waiting for 1 slot (4 CPUs each): 0 free of 6, 1 held by job a, 5 held by job c");
  t.release("d");
  // an elastic job counts its own ranks and devices as its own: a may use both GPU pairs
  auto mine = t.available(needs(job("a", 0), 0, 2), 1500);
  REQUIRE(mine.size() == 1);
  CHECK(mine[0].name == "g1");
  CHECK(mine[0].slots == 2);
  // another GPU job may use only the free pair; a CPU-only job finds c1's left CPUs
  CHECK(t.available(needs(job("e", 0), 0, 2), 1500)[0].slots == 1);
  // c's 4 ranks of 4 CPUs fill c1's 16 processors; g1 has 8 less a's 1 and c's 4
  auto cpus = t.available(needs(job("f", 0), 1, 0), 1500);
  REQUIRE(cpus.size() == 1);
  CHECK(cpus[0].name == "g1");
  CHECK(cpus[0].slots == 3);
  // without a CPU need, slots alone count: c1's 12 free of its 16
  auto slots = t.available(job("f", 0), 1500);
  REQUIRE(slots.size() == 2);
  CHECK(slots[0].name == "c1");
  CHECK(slots[0].slots == 12);
}

TEST_CASE("placement: an elastic job keeps its ranks but grows only into slots no waiting job "
          "asked for") {
  membership_table t;
  CHECK(t.join(1, with_jobs(node("ha", 4), {{"el", "alice", 2, {}, 0}}), cert("ha"), 0) == "");
  CHECK(t.join(2, node("hb", 4), cert("hb"), 0) == "");
  auto slots = [&](int64_t now) {
    std::string out;
    for (auto& h : t.available(job("el", 0), now))
      out += (out.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
    return out;
  };
  CHECK(slots(1000) == "ha:4,hb:4");
  // a job of 7 waits (6 free of 8: the elastic job's ranks hold the other 2)
  CHECK(where(t.place(job("w", 7), 1100)).rfind("waiting for 7 slots: 6 free of 8", 0) == 0);
  CHECK(slots(1200) == "ha:2"); // its own 2; the 6 free are promised to w
  // w is gone (it stopped asking): the elastic job may grow again
  CHECK(slots(1100 + 6000) == "ha:4,hb:4");
  // a waiting job with a label reserves only where that label is
  auto b = node("hb", 4);
  b.labels = {"zone=b"};
  t.update(2, b, 7200);
  CHECK(where(t.place(job("z", 5, false, {"zone=b"}), 7300)).rfind("error", 0) == 0);
  CHECK(where(t.place(job("y", 3, false, {"zone=b"}), 7300)) == "hb:3"); // placed, held
  CHECK(where(t.place(job("x", 2, false, {"zone=b"}), 7400)).rfind("waiting", 0) == 0);
  CHECK(slots(7500) == "ha:4"); // hb's last slot is promised to x; ha is not
}

TEST_CASE("placement: a growing elastic job holds the free slots it was told, so the next job "
          "to ask is not told them too") {
  membership_table t;
  // ha: 4 slots, e1 runs 2 ranks there, e2 runs 1: one slot is free
  CHECK(t.join(1, with_jobs(node("ha", 4), {{"e1", "alice", 2, {}, 0}, {"e2", "bob", 1, {}, 0}}),
               cert("ha"), 0) == "");
  auto slots = [&](const placement_request& r, int64_t now) {
    std::string out;
    for (auto& h : t.available(r, now))
      out += (out.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
    return out;
  };
  auto e1 = job("e1", 0), e2 = job("e2", 0);
  CHECK(slots(e1, 1000) == "ha:3");
  CHECK(slots(e2, 1000) == "ha:2"); // both would be told the free slot
  // e1 asks (its discovery): the free slot is held for it
  t.hold_growth(e1, t.available(e1, 1000), 1000, "alice", 10000);
  CHECK(slots(e2, 1100) == "ha:1"); // e2 keeps its rank, is not told the slot
  CHECK(slots(e1, 1100) == "ha:3"); // e1 still is
  // e2 asking now holds nothing, and takes nothing from e1's hold
  t.hold_growth(e2, t.available(e2, 1100), 1100, "bob", 10000);
  CHECK(slots(e1, 1200) == "ha:3");
  auto v = t.view(1200);
  REQUIRE(v.placed.size() == 1);
  CHECK(v.placed[0].job == "e1");
  CHECK(v.placed[0].ranks == 1); // the held slot, not its running ranks
  CHECK(render_jobs(v).find("running (1 more slot held: it grows)") != std::string::npos);
  // e1's third rank runs: the hold is let go (the slot is its rank's now)
  t.update(1, with_jobs(node("ha", 4), {{"e1", "alice", 3, {}, 0}, {"e2", "bob", 1, {}, 0}}),
           1300);
  CHECK(slots(e2, 1400) == "ha:1");
  CHECK(t.view(1400).placed.empty());
  // a hold that is not used ends after its time: e1 shrank back to 2 and asked, then
  // never grew
  t.update(1, with_jobs(node("ha", 4), {{"e1", "alice", 2, {}, 0}, {"e2", "bob", 1, {}, 0}}),
           1500);
  t.hold_growth(e1, t.available(e1, 1500), 1500, "alice", 10000);
  CHECK(slots(e2, 1600) == "ha:1");
  CHECK(slots(e2, 1500 + 10001) == "ha:2");
  // a job at its --max-np holds nothing (it would not grow into the slot)
  auto capped = job("e1", 2);
  t.hold_growth(capped, t.available(capped, 20000), 20000, "alice", 10000);
  CHECK(slots(e2, 20100) == "ha:2");
  // ... and one below it holds no more than it may still add
  t.update(1, with_jobs(node("ha", 8), {{"e1", "alice", 2, {}, 0}, {"e2", "bob", 1, {}, 0}}),
           21000);
  auto three = job("e1", 3);
  t.hold_growth(three, t.available(three, 21000), 21000, "alice", 10000);
  CHECK(slots(e2, 21100) == "ha:5"); // 8 - 2 (e1's) - 1 held for e1; e2's own 1 counts
  // a growth hold is not written for the table's restart (the job asks the new table)
  CHECK(t.placements_text().find("e1") == std::string::npos);
}

TEST_CASE("node book: --slots counts every job's ranks on the node; each holds an index") {
  node_book b;
  b.set_capacity(3);
  b.open(1, {"j1", "alice", 0, {}, 0});
  b.open(2, {"j2", "bob", 0, {}, 0});
  std::string why;
  CHECK(b.take(1, 2, why) == std::vector<uint32_t>{0, 1});
  CHECK(b.take(2, 2, why).empty());
  CHECK(why == "the node has 3 slots for all jobs and 2 are held (2 by job j1); 2 more do not fit");
  CHECK(b.take(2, 1, why) == std::vector<uint32_t>{2});
  b.give_back(1, 0);
  CHECK(b.take(2, 1, why) == std::vector<uint32_t>{0}); // the lowest free index
  CHECK(b.snapshot()[0].ranks == 1);
  CHECK(b.snapshot()[1].ranks == 2);
  b.give_back(1, 2); // not j1's: nothing changes
  CHECK(b.snapshot()[1].ranks == 2);
  b.close(2); // j2's colocator ends: all its slots are free
  CHECK(b.take(1, 2, why) == std::vector<uint32_t>{0, 2});
  node_book unlimited;
  unlimited.open(1, {"j1", "", 0, {}, 0});
  CHECK(unlimited.take(1, 5, why).size() == 5);
}

TEST_CASE("node book: each change is told at once (the joiner reports it), a refusal is not") {
  node_book b;
  b.set_capacity(2);
  int told = 0;
  std::vector<uint32_t> ranks_seen;
  b.on_change([&] {
    ++told;
    uint32_t ranks = 0;
    for (auto& j : b.snapshot()) // the book's lock is not held: reading it is fine
      ranks += j.ranks;
    ranks_seen.push_back(ranks);
  });
  b.open(1, {"j1", "alice", 0, {}, 0});
  std::string why;
  CHECK(b.take(1, 2, why).size() == 2);
  CHECK(b.take(1, 1, why).empty()); // refused: nothing changed
  b.give_back(1, 7);                // not held: nothing changed
  b.give_back(1, 0);
  b.set_gpus(1, {0});
  b.close(1);
  CHECK(told == 5);
  CHECK(ranks_seen == std::vector<uint32_t>{0, 2, 1, 1, 0});
}

TEST_CASE("placement: a job id is its owner's: another driver neither takes nor frees it") {
  membership_table t;
  CHECK(t.join(1, node("ha", 2), cert("ha"), 0) == "");
  CHECK(where(t.place(job("j1", 2), 1000, "alice")) == "ha:2");
  // bob read j1's id off status and asks under it: refused, nothing of alice's changes
  CHECK(where(t.place(job("j1", 2), 1100, "bob")) == "error: job id j1 is another owner's");
  t.release("j1", "bob");
  CHECK(where(t.place(job("j2", 1), 1200, "bob")) == "waiting for 1 slot: 0 free of 2, 2 held "
                                                       "by job j1");
  // ... nor jump into its place in line
  CHECK(where(t.place(job("j2", 1), 1300, "carol")) == "error: job id j2 is another owner's");
  t.release("j1", "alice");
  CHECK(where(t.place(job("j2", 1), 1400, "bob")) == "ha:1");
  // a node's word on its slots is capped, and sums do not wrap
  membership_table big;
  auto huge = node("hx", 0xffffffffu);
  CHECK(big.join(1, huge, cert("hx"), 0) == "");
  CHECK(big.join(2, node("hy", 0xffffffffu), cert("hy"), 0) == "");
  CHECK(where(big.place(job("j", 70000, true), 10, "alice")) == "hx:35000,hy:35000");
}

TEST_CASE("placement: a node the administrator drained gets no ranks before its own report "
          "says so, nor after it joins again; undrained, it does") {
  membership_table t;
  CHECK(t.join(1, node("ha", 2), cert("ha"), 0) == "");
  CHECK(t.join(2, node("hb", 4), cert("hb"), 0) == "");
  CHECK(t.set_drained("hb", true) == "");
  CHECK(t.drained("hb"));
  // hb has not reported its drain yet (its info says nothing): the table's mark counts
  CHECK(where(t.place(job("j1", 2), 1000)) == "ha:2");
  t.release("j1");
  CHECK(where(t.place(job("j2", 3), 1100))
        == "error: the cluster's live nodes have 2 slots in all; -np 3 cannot fit");
  // lost and joined again (a new agent that knows nothing of the drain): still drained
  t.gone(2, false, 1200);
  CHECK(t.join(3, node("hb", 4), cert("hb"), 1300) == "");
  CHECK(t.drained("hb"));
  CHECK(where(t.place(job("j3", 2), 1400)) == "ha:2");
  t.release("j3");
  CHECK_FALSE(t.undrained("hb"));
  CHECK(t.set_drained("hb", false) == "");
  CHECK_FALSE(t.drained("hb"));
  CHECK(where(t.place(job("j4", 4), 1500)) == "hb:4");
}

TEST_CASE("drain: the table tells a re-joining node the administrator's last word, and a "
          "fresh table has none") {
  membership_table t;
  CHECK(t.join(1, node("ha"), cert("ha"), 0) == "");
  CHECK_FALSE(t.drained("ha"));
  CHECK_FALSE(t.undrained("ha")); // no word: a node keeps what it kept
  t.gone(1, false, 100);
  // an undrain while it is away: the re-joining node hears it (it may have kept a drain)
  CHECK(t.set_drained("ha", false) == "");
  CHECK(t.undrained("ha"));
  CHECK(t.join(2, node("ha"), cert("ha"), 200) == "");
  CHECK(t.undrained("ha"));
  CHECK_FALSE(t.drained("ha"));
  // a drain replaces it
  CHECK(t.set_drained("ha", true) == "");
  CHECK(t.drained("ha"));
  CHECK_FALSE(t.undrained("ha"));
  // a node the table never heard of has no word either way
  CHECK_FALSE(t.drained("hz"));
  CHECK_FALSE(t.undrained("hz"));
}

TEST_CASE("drain mark: kept in the state directory, read back, removed by an undrain; a "
          "directory that cannot be read is an error, not 'not drained'") {
  char tmpl[] = "/tmp/caf-hvd-drain-mark-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  CHECK_FALSE(read_drain_mark(dir).has_value());
  CHECK(write_drain_mark(dir, true, "drained by the cluster's administrator 'ops'") == "");
  auto got = read_drain_mark(dir);
  REQUIRE(got.has_value());
  CHECK(*got == "drained by the cluster's administrator 'ops'");
  CHECK_FALSE(std::filesystem::exists(drain_mark_path(dir) + ".tmp"));
  CHECK(write_drain_mark(dir, false, "") == "");
  CHECK_FALSE(read_drain_mark(dir).has_value());
  CHECK(write_drain_mark(dir, false, "") == ""); // undrained twice: nothing to remove
  CHECK_THROWS_WITH_AS(read_drain_mark(dir + "/nope"),
                       doctest::Contains("No such file or directory"), std::runtime_error);
  CHECK(write_drain_mark(dir + "/nope", true, "x").find("cannot write") == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("placement: a table whose agent restarted makes a job that does not fit yet wait "
          "until the members it had joined again or the grace ends, then refuses it") {
  membership_table t;
  t.rejoin_until(10'000, 0, {"ha", "hb"});
  CHECK(t.join(1, node("ha", 2), cert("ha"), 100) == "");
  auto early = t.place(job("j1", 3), 1'500);
  CHECK(early.error == "");
  CHECK(early.waiting);
  CHECK(early.waiting_for == "3 slots: the cluster's table restarted 1.5 s ago and waits up to "
                             "10 s for its members to join again: 1 of 2 have (not yet: hb)");
  CHECK(t.rejoining(9'999) != "");
  CHECK(t.rejoining(10'000) == "");
  // a job that fits what has joined is placed at once
  CHECK(where(t.place(job("j2", 2), 2'000)) == "ha:2");
  t.release("j2");
  // hb joins again: the window ends there, and j1 is placed
  CHECK(t.join(2, node("hb", 2), cert("hb"), 3'000) == "");
  CHECK(t.rejoining(3'000) == "");
  CHECK(where(t.place(job("j1", 3), 3'100)) == "ha:2,hb:1");
  t.release("j1");
  CHECK(where(t.place(job("j3", 5), 3'200))
        == "error: the cluster's live nodes have 4 slots in all; -np 5 cannot fit");
  // a member that never comes back: the grace ends the window
  membership_table u;
  u.rejoin_until(10'000, 0, {"hz"});
  CHECK(u.place(job("j4", 1, false, {"zone=b"}), 500).waiting);
  CHECK(where(u.place(job("j4", 1, false, {"zone=b"}), 10'500))
        == "error: the cluster has no live node labelled zone=b to place on");
  // a table with no members to wait for (a new cluster) answers at once
  membership_table v;
  CHECK(v.rejoining(0) == "");
  CHECK(where(v.place(job("j5", 1), 0)) == "error: the cluster has no live node to place on");
}

TEST_CASE("placement: a restarted table keeps the slots held for placed jobs and the "
          "waiting line, from its record") {
  membership_table t;
  CHECK(t.join(1, node("ha", 2), cert("ha"), 0) == "");
  CHECK(t.join(2, node("hb", 2), cert("hb"), 0) == "");
  CHECK(where(t.place(job("a", 3), 100, "alice")) == "ha:2,hb:1"); // held, not started
  CHECK(t.place(job("w", 2), 200, "bob").waiting);                  // waits in line
  auto record = t.placements_text();
  // the agent restarts: a new table, its members joining again one by one
  membership_table u;
  u.rejoin_until(10'000, 1'000, {"ha", "hb"});
  u.restore_placements(record, 1'000);
  CHECK(u.join(1, node("ha", 2), cert("ha"), 1'100) == "");
  // a's slots are still held: a third job that needs them waits, even once hb is back
  CHECK(u.place(job("c", 1), 1'200, "carol").waiting);
  CHECK(u.join(2, node("hb", 2), cert("hb"), 1'300) == "");
  auto c = u.place(job("c", 1), 1'400, "carol");
  CHECK(c.waiting);
  CHECK(c.waiting_for.find("1 job asked first") != std::string::npos); // w kept its place
  // a asks again (its driver reconnected): the same hosts, not a second set
  CHECK(where(u.place(job("a", 3), 1'500, "alice")) == "ha:2,hb:1");
  // the view lists both
  auto v = u.view(1'600);
  REQUIRE(v.placed.size() == 1);
  CHECK((v.placed[0].job == "a" && v.placed[0].ranks == 3 && v.placed[0].since_ms == 100));
  REQUIRE(v.waiting.size() == 2);
  CHECK((v.waiting[0].job == "w" && v.waiting[0].since_ms == 200));
  // a's ranks start (the agents report them): its hold is let go, w is served first
  auto ha = node("ha", 2), hb = node("hb", 2);
  ha.jobs = {job_summary{"a", "alice", 2, {}, 1'700}};
  hb.jobs = {job_summary{"a", "alice", 1, {}, 1'700}};
  CHECK(u.update(1, ha, 1'700));
  CHECK(u.update(2, hb, 1'700));
  CHECK(u.place(job("c", 1), 1'800, "carol").waiting);
  CHECK(where(u.place(job("w", 1), 1'900, "bob")).rfind("waiting", 0) != 0);
  // a record that is not one is refused, saying so
  membership_table x;
  CHECK_THROWS_WITH(x.restore_placements("{\"held\": 3}", 0),
                    doctest::Contains("not a record of the table's placements"));
}

TEST_CASE("placement: without a rejoin window, a restored hold on a node that is not in the "
          "table is let go") {
  membership_table t;
  CHECK(t.join(1, node("ha", 2), cert("ha"), 0) == "");
  CHECK(where(t.place(job("a", 2), 100, "alice")) == "ha:2");
  membership_table u;
  u.restore_placements(t.placements_text(), 1'000);
  CHECK(u.join(1, node("hb", 2), cert("hb"), 1'000) == "");
  CHECK(where(u.place(job("b", 2), 1'100, "bob")) == "hb:2");
  auto placed = u.view(1'200).placed; // b's hold alone: a's went with its node
  REQUIRE(placed.size() == 1);
  CHECK(placed[0].job == "b");
}

TEST_CASE("table members: kept in the state directory for a table that restarts") {
  char tmpl[] = "/tmp/caf-hvd-members-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  CHECK(read_table_members(dir).empty());
  CHECK(write_table_members(dir, {"ha", "hb"}) == "");
  CHECK(read_table_members(dir) == std::vector<std::string>{"ha", "hb"});
  CHECK(write_table_members(dir, {}) == "");
  CHECK(read_table_members(dir).empty());
  std::filesystem::remove_all(dir);
}
