// Horovod's worked examples (reference/horovod.md §1.4 and §1.6) as test vectors.
#include <doctest/doctest.h>

#include <set>

#include "runtime/job/assignment.hpp"

using namespace cafhvd;

namespace {

rank_registry colocated(const std::vector<std::pair<std::string, int>>& layout) {
  rank_registry reg;
  int rank = 0;
  for (auto& [node, n] : layout)
    for (int i = 0; i < n; ++i)
      reg.add(node, node, rank++);
  return reg;
}

} // namespace

TEST_CASE("coordinator: 2 hosts x 2 slots") {
  auto reg = colocated({{"A", 2}, {"B", 2}});
  CHECK(reg.node_string() == "A:2,B:2");
  auto v = reg.finalize();
  CHECK(v[0] == local_cross{0, 2, 0, 2});
  CHECK(v[1] == local_cross{1, 2, 0, 2});
  CHECK(v[2] == local_cross{0, 2, 1, 2});
  CHECK(v[3] == local_cross{1, 2, 1, 2});
}

TEST_CASE("coordinator: interleaved ranks {A:[0,2], B:[1,3]}") {
  rank_registry reg;
  reg.add("A", "A", 0);
  reg.add("B", "B", 1);
  reg.add("A", "A", 2);
  reg.add("B", "B", 3);
  auto v = reg.finalize();
  CHECK(v[0] == local_cross{0, 2, 0, 2});
  CHECK(v[2] == local_cross{1, 2, 0, 2});
  CHECK(v[1] == local_cross{0, 2, 1, 2});
  CHECK(v[3] == local_cross{1, 2, 1, 2});
}

TEST_CASE("coordinator: imbalanced 3+1 and 1+3") {
  auto v = colocated({{"A", 3}, {"B", 1}}).finalize();
  CHECK(v[0] == local_cross{0, 3, 0, 2});
  CHECK(v[1] == local_cross{1, 3, 0, 1});
  CHECK(v[2] == local_cross{2, 3, 0, 1});
  CHECK(v[3] == local_cross{0, 1, 1, 2});
  auto m = colocated({{"A", 1}, {"B", 3}}).finalize();
  CHECK(m[0] == local_cross{0, 1, 0, 2});
  CHECK(m[1] == local_cross{0, 3, 1, 2});
  CHECK(m[2] == local_cross{1, 3, 0, 1});
  CHECK(m[3] == local_cross{2, 3, 0, 1});
}

TEST_CASE("coordinator: 5/4/3 ranks on three nodes (test_cross_rank)") {
  auto v = colocated({{"A", 5}, {"B", 4}, {"C", 3}}).finalize();
  REQUIRE(v.size() == 12);
  int cs3 = 0, cs2 = 0, cs1 = 0;
  std::set<int> cr_of_cs2;
  for (auto& x : v) {
    cs3 += x.cross_size == 3;
    cs1 += x.cross_size == 1;
    if (x.cross_size == 2) {
      ++cs2;
      cr_of_cs2.insert(x.cross_rank);
    }
  }
  CHECK(cs3 == 9);
  CHECK(cs2 == 2);
  CHECK(cs1 == 1);
  CHECK(cr_of_cs2 == std::set<int>{0, 1});
}

TEST_CASE("coordinator: uniform 3x4") {
  auto v = colocated({{"A", 4}, {"B", 4}, {"C", 4}}).finalize();
  for (int r = 0; r < 12; ++r)
    CHECK(v[r] == local_cross{r % 4, 4, r / 4, 3});
}

TEST_CASE("coordinator: groups by node identity, not hostname") {
  rank_registry reg;
  reg.add("same-host", "agent-1", 0);
  reg.add("same-host", "agent-2", 1);
  auto v = reg.finalize();
  CHECK(v[0] == local_cross{0, 1, 0, 2});
  CHECK(v[1] == local_cross{0, 1, 1, 2});
  CHECK_THROWS(reg.add("x", "agent-3", 1));
}

TEST_CASE("get_host_assignments: homogeneous, capped, heterogeneous") {
  auto full = get_host_assignments({{"worker-0", 2}, {"worker-1", 2}}, 4);
  REQUIRE(full.size() == 4);
  std::vector<int> cross;
  for (auto& s : full) {
    cross.push_back(s.cross_rank);
    CHECK(s.cross_size == 2);
    CHECK(s.size == 4);
  }
  CHECK(cross == std::vector<int>{0, 0, 1, 1});

  auto capped = get_host_assignments({{"worker-0", 2}, {"worker-1", 2}}, 2, 2);
  REQUIRE(capped.size() == 2);
  for (auto& s : capped) {
    CHECK(s.hostname == "worker-0");
    CHECK(s.size == 2);
    CHECK(s.cross_size == 1);
  }

  auto het = get_host_assignments({{"worker-0", 1}, {"worker-1", 2}}, 3);
  CHECK(het[0] == slot_info{"worker-0", 0, 0, 0, 3, 1, 2});
  CHECK(het[1] == slot_info{"worker-1", 1, 0, 1, 3, 2, 2});
  CHECK(het[2] == slot_info{"worker-1", 2, 1, 0, 3, 2, 1});
  CHECK(het[2].to_response_string() == "2,3,1,2,0,1");
  CHECK(slot_info{}.to_response_string() == "-1,-1,-1,-1,-1,-1");
}

TEST_CASE("get_host_assignments: too few slots and duplicate hosts") {
  CHECK_THROWS_WITH(get_host_assignments({{"a", 2}}, 3),
                    doctest::Contains("requested 3 processes but the hosts offer only 2"));
  CHECK_THROWS_WITH(get_host_assignments({{"a", 2}, {"a", 1}}, 1),
                    doctest::Contains("appears twice"));
}

TEST_CASE("the coordinator's plan matches get_host_assignments for colocated ranks") {
  for (auto layout : std::vector<std::vector<std::pair<std::string, int>>>{
           {{"A", 2}, {"B", 2}}, {{"A", 3}, {"B", 1}}, {{"A", 1}, {"B", 2}, {"C", 1}}}) {
    std::vector<host_slots> hosts;
    int np = 0;
    for (auto& [h, n] : layout) {
      hosts.push_back({h, n});
      np += n;
    }
    CHECK(colocated(layout).plan() == get_host_assignments(hosts, np));
  }
}
