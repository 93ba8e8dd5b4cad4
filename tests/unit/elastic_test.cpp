// Elastic building blocks: host order, cooldowns, host changes, the discovery script
// runner (real processes), and the rendezvous server's elastic endpoints over sockets.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "runtime/job/elastic.hpp"
#include "runtime/job/host_spec.hpp"
#include "runtime/horovod/rendezvous_server.hpp"
#include "socket_util.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

namespace {

std::string http(uint16_t port, const std::string& path, std::chrono::milliseconds t = 3s) {
  int fd = test::connect_to(port);
  auto req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  auto out = test::read_all(fd, t);
  ::close(fd);
  return out;
}

std::string body_of(const std::string& r) {
  auto p = r.find("\r\n\r\n");
  return p == std::string::npos ? "" : r.substr(p + 4);
}

int status_of(const std::string& r) {
  return r.size() < 12 ? 0 : std::stoi(r.substr(9, 3));
}

struct temp_script {
  std::string path;
  explicit temp_script(const std::string& text) {
    char tmpl[] = "/tmp/caf-hvd-discovery-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
    path = tmpl;
    ::chmod(path.c_str(), 0700);
  }
  ~temp_script() { ::unlink(path.c_str()); }
};

} // namespace

TEST_CASE("host order: old hosts keep their order, new ones are appended as listed") {
  CHECK(order_hosts({}, {"b", "a"}) == std::vector<std::string>{"b", "a"});
  CHECK(order_hosts({"a", "b", "c"}, {"d", "c", "a"}) == std::vector<std::string>{"a", "c", "d"});
  CHECK(order_hosts({"a", "b"}, {"z", "y", "b"}) == std::vector<std::string>{"b", "z", "y"});
  CHECK(order_hosts({"a"}, {}).empty());
}

TEST_CASE("cooldown: low * 2^k plus jitter, clamped to [low, high]") {
  cooldown_range r{10, 100};
  CHECK(cooldown_delay(r, 1, 0.0) == 20s);
  CHECK(cooldown_delay(r, 1, 0.5) == 25s);
  CHECK(cooldown_delay(r, 2, 0.0) == 40s);
  CHECK(cooldown_delay(r, 3, 0.9) == 89s);
  CHECK(cooldown_delay(r, 4, 0.0) == 100s);
  CHECK(cooldown_delay(r, 1000, 0.99) == 100s);
  CHECK(cooldown_delay({1, 2}, 1, 0.3) == 2s);
  CHECK(cooldown_delay({5, 5}, 1, 0.0) == 5s);
}

TEST_CASE("host changes: added / removed / mixed / none, slot counts included") {
  using v = std::vector<host_slots>;
  using h = host_slots;
  CHECK(compare_hosts(v{}, v{h{"a", 2}}) == host_change::added);
  CHECK(compare_hosts(v{h{"a", 2}}, v{h{"a", 2}, h{"b", 1}}) == host_change::added);
  CHECK(compare_hosts(v{h{"a", 2}}, v{h{"a", 3}}) == host_change::added);
  CHECK(compare_hosts(v{h{"a", 2}, h{"b", 1}}, v{h{"b", 1}}) == host_change::removed);
  CHECK(compare_hosts(v{h{"a", 2}}, v{h{"a", 1}}) == host_change::removed);
  CHECK(compare_hosts(v{h{"a", 2}}, v{h{"b", 2}}) == host_change::mixed);
  CHECK(compare_hosts(v{{"a", 2}, {"b", 2}}, v{{"b", 2}, {"a", 2}}) == host_change::none);
  CHECK(std::string{to_string(host_change::mixed)} == "mixed");
}

TEST_CASE("elastic assignment: Horovod's worked example of adding and removing hosts") {
  // [A(2)] -> add B(1), C(1) -> remove A
  auto g1 = get_host_assignments({{"A", 2}}, 1);
  CHECK(g1[1].rank == 1);
  auto g2 = get_host_assignments({{"A", 2}, {"B", 1}, {"C", 1}}, 1);
  CHECK(g2[0].rank == 0);
  CHECK(g2[1].rank == 1);
  CHECK(g2[2].hostname == "B");
  CHECK(g2[2].rank == 2);
  CHECK(g2[3].rank == 3);
  CHECK(g2[0].cross_size == 3);
  CHECK(g2[1].cross_size == 1);
  auto order = order_hosts({"A", "B", "C"}, {"B", "C"});
  auto g3 = get_host_assignments({{order[0], 1}, {order[1], 1}}, 1);
  CHECK(g3[0].hostname == "B");
  CHECK(g3[0].rank == 0);
  CHECK(g3[1].hostname == "C");
}

TEST_CASE("discovery script: output, failures with stderr, timeout kills its process group") {
  {
    temp_script s{"#!/bin/sh\nprintf 'h1:2\\nh2\\n'\n"};
    auto r = run_discovery_script(CAF_HVD_EXEC, s.path, 5s);
    CHECK(r.ok);
    CHECK(r.output == "h1:2\nh2\n");
    auto hosts = parse_discovery_output(r.output, 3u);
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[1].slots == 3);
  }
  {
    temp_script s{"#!/bin/sh\necho one >&2\necho two >&2\nexit 4\n"};
    auto r = run_discovery_script(CAF_HVD_EXEC, s.path, 5s);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "exited with code 4; its stderr ends with: one\ntwo");
  }
  {
    temp_script s{"#!/bin/sh\nkill -9 $$\n"};
    auto r = run_discovery_script(CAF_HVD_EXEC, s.path, 5s);
    CHECK_FALSE(r.ok);
    CHECK(r.error.find("killed by signal 9") != std::string::npos);
  }
  {
    // A grandchild that keeps stdout open must not hold the caller past the timeout,
    // and does not outlive it.
    std::string pidfile = "/tmp/caf-hvd-discovery-bg-" + std::to_string(getpid());
    temp_script s{"#!/bin/sh\necho partial\nsleep 30 &\necho $! > " + pidfile + "\nsleep 30\n"};
    auto t0 = std::chrono::steady_clock::now();
    auto r = run_discovery_script(CAF_HVD_EXEC, s.path, 300ms);
    CHECK(std::chrono::steady_clock::now() - t0 < 3s);
    CHECK_FALSE(r.ok);
    CHECK(r.error.find("did not finish within 0.3 s") != std::string::npos);
    std::ifstream in{pidfile};
    int bg = 0;
    in >> bg;
    REQUIRE(bg > 0);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      gone = ::kill(bg, 0) != 0;
      std::this_thread::sleep_for(10ms);
    }
    CHECK(gone);
    ::unlink(pidfile.c_str());
  }
  {
    auto r = run_discovery_script(CAF_HVD_EXEC, "/nonexistent/discover", 1s);
    CHECK_FALSE(r.ok);
    CHECK(r.error.find("could not be started") != std::string::npos);
  }
}

TEST_CASE("server: rank_and_size holds votes until release; -1 for slots not in the plan") {
  rendezvous_server srv{rendezvous_options{}};
  std::mutex m;
  std::vector<std::string> votes;
  srv.enable_elastic([&](const std::string& host, int lr) {
    std::lock_guard<std::mutex> g{m};
    votes.push_back(host + ":" + std::to_string(lr));
  });
  std::string a, b, gone;
  std::thread ta{[&] { a = http(srv.port(), "/rank_and_size/hostA:1", 5s); }};
  std::thread tb{[&] { b = http(srv.port(), "/rank_and_size/host.b:0", 5s); }};
  std::thread tg{[&] { gone = http(srv.port(), "/rank_and_size/old:0", 5s); }};
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> g{m};
      if (votes.size() == 3)
        break;
    }
    std::this_thread::sleep_for(5ms);
  }
  {
    std::lock_guard<std::mutex> g{m};
    CHECK(votes.size() == 3);
  }
  CHECK(a.empty()); // still held
  srv.answer_slot("old:0", "-1,-1,-1,-1,-1,-1");
  tg.join();
  CHECK(body_of(gone) == "-1,-1,-1,-1,-1,-1");
  srv.release(get_host_assignments({{"hostA", 2}, {"host.b", 1}}, 1));
  ta.join();
  tb.join();
  CHECK(status_of(a) == 200);
  CHECK(body_of(a) == "1,3,1,2,0,1");
  CHECK(body_of(b) == "2,3,0,1,1,2");
  CHECK(status_of(http(srv.port(), "/rank_and_size/nocolon")) == 400);
  CHECK(status_of(http(srv.port(), "/rank_and_size/h:x")) == 400);
}

TEST_CASE("server: /elastic/update answers the newest generation, long-polls for a newer one") {
  rendezvous_server srv{rendezvous_options{}};
  srv.enable_elastic([](const std::string&, int) {});
  srv.set_update(1, "generation 1\nchange added\n");
  auto now = http(srv.port(), "/elastic/update");
  CHECK(body_of(now) == "generation 1\nchange added\n");
  CHECK(body_of(http(srv.port(), "/elastic/update?after=0&wait_ms=5000"))
        == "generation 1\nchange added\n");
  std::string later;
  auto t0 = std::chrono::steady_clock::now();
  std::thread t{[&] { later = http(srv.port(), "/elastic/update?after=1&wait_ms=5000", 6s); }};
  // the waiter is registered (the server counts it) before the update comes, so the
  // update's wake-up is what answers it
  for (auto end = std::chrono::steady_clock::now() + 5s;
       srv.stats().long_polls < 1 && std::chrono::steady_clock::now() < end;)
    std::this_thread::sleep_for(1ms);
  CHECK_MESSAGE(srv.stats().long_polls == 1, "the long poll never registered within 5 s");
  srv.set_update(2, "generation 2\nchange removed\nremoved hostA\n");
  t.join();
  CHECK(body_of(later) == "generation 2\nchange removed\nremoved hostA\n");
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  // nothing newer: answered with the current one when the wait ends
  t0 = std::chrono::steady_clock::now();
  CHECK(body_of(http(srv.port(), "/elastic/update?after=2&wait_ms=300"))
        == "generation 2\nchange removed\nremoved hostA\n");
  CHECK(std::chrono::steady_clock::now() - t0 >= 250ms);
  CHECK(status_of(http(srv.port(), "/elastic/update?after=x")) == 400);
  CHECK(status_of(http(srv.port(), "/elastic/update?bogus=1")) == 400);
}

TEST_CASE("server: without enable_elastic the elastic paths are plain keys") {
  rendezvous_server srv{rendezvous_options{}};
  CHECK(status_of(http(srv.port(), "/rank_and_size/h:0")) == 404);
  CHECK(status_of(http(srv.port(), "/elastic/update")) == 404);
}
