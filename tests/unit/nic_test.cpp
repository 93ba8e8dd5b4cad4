// NIC discovery: real probes over loopback addresses, and the choice per host.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <memory>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/network/nic_probe.hpp"
#include "socket_util.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

namespace {

probe_result ok(std::string iface, std::string local, std::string host, std::string addr) {
  return {std::move(iface), std::move(local), std::move(host), std::move(addr), true, ""};
}
probe_result bad(std::string iface, std::string local, std::string host, std::string addr) {
  return {std::move(iface),        std::move(local), std::move(host), std::move(addr), false,
          "Network is unreachable"};
}

} // namespace

TEST_CASE("probes: a responder answers with its name and the address it saw") {
  probe_responder a{"node-a"};
  std::vector<interface_addr> local{{"lo", "127.0.0.1", 8, true}, {"lo2", "127.0.0.2", 8, true}};
  auto results = probe_peers(
      local, {{"node-a", "127.0.0.1", a.port()}, {"node-x", "127.0.0.1", a.port()}}, 2s);
  REQUIRE(results.size() == 4);
  CHECK(results[0].ok); // lo -> node-a
  CHECK(results[1].error.find("answered by node 'node-a'") != std::string::npos);
  CHECK(results[2].ok); // 127.0.0.2 -> 127.0.0.1, seen as 127.0.0.2
  CHECK(results[2].local_address == "127.0.0.2");
}

TEST_CASE("probes: refused and silent peers fail within the timeout") {
  probe_responder a{"node-a"};
  // a silent peer: it listens (the kernel completes the handshake) but never answers;
  // bound before the dead peer's port is freed, so the kernel cannot hand it that port
  int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(silent, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  REQUIRE(::listen(silent, 8) == 0);
  socklen_t len = sizeof(sa);
  ::getsockname(silent, reinterpret_cast<sockaddr*>(&sa), &len);
  uint16_t dead;
  {
    probe_responder gone{"gone"};
    dead = gone.port();
  }
  auto t0 = std::chrono::steady_clock::now();
  auto results = probe_peers({{"lo", "127.0.0.1", 8, true}},
                             {{"gone", "127.0.0.1", dead}, {"node-b", "127.0.0.1", ntohs(sa.sin_port)}},
                             300ms);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  ::close(silent);
  REQUIRE(results.size() == 2);
  CHECK_FALSE(results[0].ok);
  CHECK(results[0].error == "Connection refused");
  CHECK_FALSE(results[1].ok);
  CHECK(results[1].error == "connected but no answer in time");
}

TEST_CASE("probes: many peers and interfaces stay within a low descriptor limit") {
  std::vector<std::unique_ptr<probe_responder>> peers;
  std::vector<probe_target> targets;
  for (int i = 0; i < 40; ++i) {
    auto name = "peer-" + std::to_string(i);
    peers.push_back(std::make_unique<probe_responder>(name));
    targets.push_back({name, "127.0.0.1", peers.back()->port()});
  }
  std::vector<interface_addr> local{{"lo", "127.0.0.1", 8, true}, {"lo2", "127.0.0.2", 8, true},
                                    {"lo3", "127.0.0.3", 8, true}};
  // 120 probes; the process (probes and responders together) gets 24 descriptors more
  // than it holds now: all at once would run out and report false failures
  test::lowered_descriptor_limit limit{24};
  auto bounded = probe_peers(local, targets, 2s, 8);
  limit.restore();
  REQUIRE(bounded.size() == 120);
  for (auto& r : bounded)
    CHECK_MESSAGE(r.ok, r.iface << " -> " << r.host << ": " << r.error);
}

TEST_CASE("choice: per-host interfaces with different names, decoys left out") {
  std::vector<host_interfaces> hosts{
      {"h0", {{"dummy0", "10.214.0.1", 24, false}, {"eth0", "10.213.7.1", 24, false}}},
      {"h1", {{"abc0", "10.214.1.1", 24, false}, {"ens5", "10.213.7.2", 24, false}}},
  };
  std::vector<std::vector<probe_result>> results{
      {bad("dummy0", "10.214.0.1", "h1", "10.213.7.2"),
       ok("eth0", "10.213.7.1", "h1", "10.213.7.2"), bad("eth0", "10.213.7.1", "h1", "10.214.1.1")},
      {bad("abc0", "10.214.1.1", "h0", "10.213.7.1"), ok("ens5", "10.213.7.2", "h0", "10.213.7.1")},
  };
  auto c = choose_interfaces(hosts, results, {});
  REQUIRE(c.size() == 2);
  CHECK(c[0].iface == "eth0");
  CHECK(c[0].usable == std::vector<std::string>{"eth0"});
  CHECK(c[0].address == "10.213.7.1");
  CHECK(c[1].iface == "ens5");
  CHECK(c[1].address == "10.213.7.2");
}

TEST_CASE("choice: no common network explains every host") {
  std::vector<host_interfaces> hosts{{"h0", {{"eth0", "10.0.0.1", 24, false}}},
                                     {"h1", {{"eth0", "10.0.1.1", 24, false}}}};
  std::vector<std::vector<probe_result>> results{{bad("eth0", "10.0.0.1", "h1", "10.0.1.1")},
                                                 {bad("eth0", "10.0.1.1", "h0", "10.0.0.1")}};
  CHECK_THROWS_WITH(choose_interfaces(hosts, results, {}),
                    doctest::Contains("host h0: no interface reaches every other host\n    eth0: "
                                      "10.0.0.1 -> h1 10.0.1.1: Network is unreachable"));
}

TEST_CASE("choice: a named interface that does not work is an error naming host and interface") {
  std::vector<host_interfaces> hosts{{"h0", {{"dummy0", "10.214.0.1", 24, false}}},
                                     {"h1", {{"dummy0", "10.214.1.1", 24, false}}}};
  std::vector<std::vector<probe_result>> results{{bad("dummy0", "10.214.0.1", "h1", "10.214.1.1")},
                                                 {bad("dummy0", "10.214.1.1", "h0", "10.214.0.1")}};
  CHECK_THROWS_WITH(
      choose_interfaces(hosts, results, {"dummy0"}),
      doctest::Contains("interface dummy0 on host h0 does not reach every other host"));
}

TEST_CASE("candidates: loopback excluded, names restrict, a host without them is named") {
  host_interfaces h{"h0", {{"lo", "127.0.0.1", 8, true}, {"eth0", "10.0.0.1", 24, false}}};
  CHECK(candidate_interfaces(h, {}).size() == 1);
  CHECK(candidate_interfaces(h, {"eth0", "ens5"}).size() == 1);
  CHECK_THROWS_WITH(candidate_interfaces(h, {"ens5"}),
                    doctest::Contains("host h0 has no interface named ens5"));
}
