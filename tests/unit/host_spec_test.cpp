// Host specs and hostfiles: what users type, and the errors they get for typos.
#include <doctest/doctest.h>
#include <sstream>

#include "runtime/job/host_spec.hpp"

using namespace cafhvd;

TEST_CASE("host specs with and without a port") {
  CHECK(parse_host_spec("node-1:4") == host_spec{"node-1", default_node_port, 4});
  CHECK(parse_host_spec("10.0.0.2:7000:2") == host_spec{"10.0.0.2", 7000, 2});
  auto hosts = parse_host_list("a:2, b:9000:1");
  REQUIRE(hosts.size() == 2);
  CHECK(hosts[1] == host_spec{"b", 9000, 1});
}

TEST_CASE("malformed host specs are rejected with the offending text") {
  CHECK_THROWS_WITH_AS(parse_host_spec("nodeonly"),
                       doctest::Contains("expected HOST:SLOTS or HOST:PORT:SLOTS"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_spec("a:zero"), doctest::Contains("'zero'"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_spec("a:0"), doctest::Contains("out of range"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_spec("a:70000:1"), doctest::Contains("port"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_spec(":2"), doctest::Contains("empty host"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_spec("a b:2"), doctest::Contains("invalid character"),
                       spec_error);
  CHECK_THROWS_WITH_AS(parse_host_list("a:1,,b:1"), doctest::Contains("empty item"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_list(""), doctest::Contains("empty host list"), spec_error);
  CHECK_THROWS_WITH_AS(parse_host_list("a:1,a:2"), doctest::Contains("listed twice"), spec_error);
  // Same host on two ports is two node agents, which is fine.
  CHECK(parse_host_list("a:7000:1,a:7001:1").size() == 2);
}

TEST_CASE("hostfiles in horovodrun's format") {
  std::istringstream in{"# cluster\n\nnode-a slots=2\nnode-b:7001 slots=4   # big one\n"
                        "node-c\n"};
  auto hosts = parse_hostfile(in, "hosts.txt");
  REQUIRE(hosts.size() == 3);
  CHECK(hosts[0] == host_spec{"node-a", default_node_port, 2});
  CHECK(hosts[1] == host_spec{"node-b", 7001, 4});
  CHECK(hosts[2] == host_spec{"node-c", default_node_port, 1});
}

TEST_CASE("hostfile errors name the file and line") {
  std::istringstream bad_slots{"a slots=2\nb slots=x\n"};
  CHECK_THROWS_WITH_AS(parse_hostfile(bad_slots, "hf"), doctest::Contains("hf:2"), spec_error);
  std::istringstream bad_key{"a cpus=2\n"};
  CHECK_THROWS_WITH_AS(parse_hostfile(bad_key, "hf"), doctest::Contains("slots=N"), spec_error);
  std::istringstream empty{"# nothing\n\n"};
  CHECK_THROWS_WITH_AS(parse_hostfile(empty, "hf"), doctest::Contains("no hosts"), spec_error);
}

TEST_CASE("discovery script output") {
  auto hosts = parse_discovery_output("# hosts\nnode-a:2\n\nnode-b:7001:4\nnode-c\n", 3u);
  REQUIRE(hosts.size() == 3);
  CHECK(hosts[0] == host_spec{"node-a", default_node_port, 2});
  CHECK(hosts[1] == host_spec{"node-b", 7001, 4});
  CHECK(hosts[2] == host_spec{"node-c", default_node_port, 3});
  CHECK(parse_discovery_output("", 1u).empty());
  CHECK_THROWS_WITH_AS(parse_discovery_output("node-c\n", std::nullopt),
                       doctest::Contains("--slots-per-host"), spec_error);
  CHECK_THROWS_WITH_AS(parse_discovery_output("a:1\nb:x\n", 1u),
                       doctest::Contains("discovery output line 2"), spec_error);
  CHECK_THROWS_WITH_AS(parse_discovery_output("a:1\na:2\n", 1u), doctest::Contains("twice"),
                       spec_error);
  CHECK_THROWS_WITH_AS(parse_discovery_output(std::string(2000, 'a'), 1u),
                       doctest::Contains("longer than 1024"), spec_error);
}

TEST_CASE("HOST:N with a port-sized N is an error that shows the three-field form") {
  CHECK(parse_host_spec("node1:512").slots == 512);
  CHECK_THROWS_WITH_AS(parse_host_spec("node1:24781"),
                       "'node1:24781': 24781 is more slots than a host runs (HOST:SLOTS takes at "
                       "most 512); for a node agent on port 24781 write node1:24781:SLOTS",
                       spec_error);
  CHECK_THROWS_WITH_AS(parse_discovery_output("node1:24781\n", std::nullopt),
                       doctest::Contains("discovery output line 1: 'node1:24781'"), spec_error);
  CHECK(parse_discovery_output("node1:24781:2\n", std::nullopt)[0].port == 24781);
}
