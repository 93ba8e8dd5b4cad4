// Allocations as batch systems describe them: Slurm hostlists and task counts (Slurm's
// documented examples; `scontrol show hostnames` is the reference), PBS node files,
// LSF host lists.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

#include "runtime/job/allocation.hpp"

using namespace cafhvd;
using strings = std::vector<std::string>;

TEST_CASE("Slurm hostlists expand as scontrol show hostnames does") {
  CHECK(expand_hostlist("tux[0-5,12,20-22]")
        == strings{"tux0", "tux1", "tux2", "tux3", "tux4", "tux5", "tux12", "tux20", "tux21",
                   "tux22"});
  auto n = expand_hostlist("n[001-128]");
  REQUIRE(n.size() == 128);
  CHECK(n.front() == "n001");
  CHECK(n[98] == "n099");
  CHECK(n.back() == "n128");
  CHECK(expand_hostlist("linux[0-2,8]") == strings{"linux0", "linux1", "linux2", "linux8"});
  CHECK(expand_hostlist("rack[1-2]-node[01-02]")
        == strings{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"});
  CHECK(expand_hostlist("a,b[1-2],c.example.org")
        == strings{"a", "b1", "b2", "c.example.org"});
  CHECK(expand_hostlist("gpu[8-10]") == strings{"gpu8", "gpu9", "gpu10"}); // no padding
  CHECK(expand_hostlist("gpu[08-10]") == strings{"gpu08", "gpu09", "gpu10"});
  CHECK(expand_hostlist("node7") == strings{"node7"});
  CHECK(expand_hostlist("x[0]y") == strings{"x0y"});
}

TEST_CASE("hostlists that do not parse say why") {
  CHECK_THROWS_WITH(expand_hostlist("tux[0-5"), "hostlist 'tux[0-5': '[' without ']'");
  CHECK_THROWS_WITH(expand_hostlist("tux0-5]"), "hostlist 'tux0-5]': ']' without '['");
  CHECK_THROWS_WITH(expand_hostlist("tux[5-1]"), "hostlist 'tux[5-1]': range '5-1' goes backwards");
  CHECK_THROWS_WITH(expand_hostlist("tux[a-b]"),
                    "hostlist 'tux[a-b]': 'a-b' is not a number or a range like 1-4");
  CHECK_THROWS_WITH(expand_hostlist("a,,b"), "hostlist 'a,,b': an empty item");
  CHECK_THROWS_WITH(expand_hostlist(""), "hostlist '': an empty item");
  CHECK_THROWS_WITH(expand_hostlist("n[1-99999999]"), doctest::Contains("more than"));
  CHECK_THROWS_WITH(expand_hostlist("a b"), doctest::Contains("white space"));
  CHECK_THROWS_WITH(expand_hostlist("n[[1]]"), doctest::Contains("do not nest"));
}

TEST_CASE("SLURM_TASKS_PER_NODE expands repeats") {
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<uint32_t>{2, 2, 2, 1});
  CHECK(expand_tasks_per_node("4") == std::vector<uint32_t>{4});
  CHECK(expand_tasks_per_node("1,8(x2)") == std::vector<uint32_t>{1, 8, 8});
  CHECK_THROWS_WITH(expand_tasks_per_node("2(3)"), doctest::Contains("'2(3)' is not N or N(xM)"));
  CHECK_THROWS(expand_tasks_per_node("x"));
  CHECK_THROWS(expand_tasks_per_node("0"));
  CHECK_THROWS(expand_tasks_per_node(""));
}

namespace {
auto env_of(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const char* key) -> const char* {
    auto it = m.find(key);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}
} // namespace

TEST_CASE("an allocation from Slurm, PBS or LSF; none outside one") {
  CHECK_FALSE(detect_allocation(default_node_port, env_of({})));
  auto s = detect_allocation(
      7000, env_of({{"SLURM_JOB_ID", "42"},
                    {"SLURM_JOB_NODELIST", "c[1-3],d1"},
                    {"SLURM_TASKS_PER_NODE", "2(x3),1"}}));
  REQUIRE(s);
  CHECK(s->source == "Slurm job 42 (SLURM_JOB_NODELIST)");
  CHECK(s->hosts == std::vector<host_spec>{{"c1", 7000, 2}, {"c2", 7000, 2}, {"c3", 7000, 2},
                                           {"d1", 7000, 1}});
  auto one = detect_allocation(default_node_port,
                               env_of({{"SLURM_JOB_ID", "7"}, {"SLURM_NODELIST", "n[1-2]"}}));
  REQUIRE(one);
  CHECK(one->hosts[1] == host_spec{"n2", default_node_port, 1});
  CHECK_THROWS_WITH(detect_allocation(default_node_port,
                                      env_of({{"SLURM_JOB_ID", "7"},
                                              {"SLURM_JOB_NODELIST", "n[1-2]"},
                                              {"SLURM_TASKS_PER_NODE", "4"}})),
                    "Slurm job 7: SLURM_TASKS_PER_NODE names 1 nodes, SLURM_JOB_NODELIST has 2");
  CHECK_THROWS_WITH(detect_allocation(default_node_port, env_of({{"SLURM_JOB_ID", "7"}})),
                    doctest::Contains("neither SLURM_JOB_NODELIST nor SLURM_NODELIST"));

  char path[] = "/tmp/caf-hvd-pbs-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream{path} << "n1\nn1\nn2\n\nn1\n";
  auto pbs = detect_allocation(default_node_port, env_of({{"PBS_NODEFILE", path}}));
  REQUIRE(pbs);
  CHECK(pbs->hosts == std::vector<host_spec>{{"n1", default_node_port, 3},
                                             {"n2", default_node_port, 1}});
  std::ofstream{path} << "";
  CHECK_THROWS_WITH(detect_allocation(default_node_port, env_of({{"PBS_NODEFILE", path}})),
                    doctest::Contains("has no nodes"));
  ::unlink(path);

  auto lsf = detect_allocation(default_node_port, env_of({{"LSB_MCPU_HOSTS", "h1 4 h2 2"}}));
  REQUIRE(lsf);
  CHECK(lsf->hosts == std::vector<host_spec>{{"h1", default_node_port, 4},
                                             {"h2", default_node_port, 2}});
  CHECK_THROWS_WITH(detect_allocation(default_node_port, env_of({{"LSB_MCPU_HOSTS", "h1 4 h2"}})),
                    doctest::Contains("host h2 has no slot count"));
}

TEST_CASE("Slurm's node addresses come from sinfo's NAME NODEADDR lines") {
  auto addrs = parse_slurm_node_addresses("n1 10.0.0.1\nn2 (null)\nn3 n3-ib\n");
  CHECK(addrs == std::map<std::string, std::string>{{"n1", "10.0.0.1"}, {"n3", "n3-ib"}});
  CHECK(parse_slurm_node_addresses("").empty());
}
