// The live view's defences: the Host header (DNS rebinding), a connection cap that idle
// connections cannot use to lock a fetch out, and JSON that never throws.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/observe/dashboard.hpp"
#include "socket_util.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

namespace {

std::string fetch(uint16_t port, const std::string& path, const std::string& host) {
  int fd = test::connect_to(port);
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  auto out = test::read_all(fd, 3s);
  ::close(fd);
  return out;
}

int status(const std::string& response) {
  return response.size() < 12 ? 0 : std::stoi(response.substr(9, 3));
}

} // namespace

TEST_CASE("dashboard: served for IP literals, localhost and configured names only (a page "
          "that rebinds its own name to this address gets 421)") {
  dashboard_options o;
  o.names = {"head.example"};
  dashboard d{o};
  auto port = std::to_string(d.port());
  CHECK(status(fetch(d.port(), "/", "127.0.0.1:" + port)) == 200);
  CHECK(status(fetch(d.port(), "/", "localhost:8080")) == 200); // an ssh tunnel's own port
  CHECK(status(fetch(d.port(), "/events.jsonl", "[::1]:" + port)) == 200);
  CHECK(status(fetch(d.port(), "/", "HEAD.example")) == 200);
  auto rebound = fetch(d.port(), "/trace.json", "attacker.example:" + port);
  CHECK(status(rebound) == 421);
  CHECK(rebound.find("traceEvents") == std::string::npos);
  CHECK(status(fetch(d.port(), "/", "")) == 421);
  CHECK(status(fetch(d.port(), "/", "localhost.attacker.example")) == 421);
  CHECK(dashboard_host_allowed("10.0.0.1", {}));
  CHECK_FALSE(dashboard_host_allowed("::1", {})); // a bare IPv6 address is not a Host value
  CHECK_FALSE(dashboard_host_allowed("[::1", {}));
}

TEST_CASE("dashboard: more idle connections than its cap do not lock a fetch out") {
  dashboard_options o;
  o.max_connections = 8;
  dashboard d{o};
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i)
    idle.push_back(test::connect_to(d.port()));
  auto got = fetch(d.port(), "/events.jsonl", "127.0.0.1");
  CHECK(status(got) == 200);
  std::this_thread::sleep_for(100ms);
  CHECK(d.connections() <= 8);
  for (int fd : idle)
    ::close(fd);
}

TEST_CASE("dashboard: a name that is not UTF-8 in an event is drawn, not thrown on") {
  dashboard d{dashboard_options{}};
  d.add({{"timestamp", 1.0},
         {"name", "rank.started"},
         {"context", {{"host", std::string("\xff\xfe")}, {"rank", 0}, {"slot", "\xc3"}}}});
  CHECK(status(fetch(d.port(), "/trace.json", "127.0.0.1")) == 200);
  CHECK(status(fetch(d.port(), "/events.jsonl", "127.0.0.1")) == 200);
  CHECK(status(fetch(d.port(), "/", "127.0.0.1")) == 200);
}
