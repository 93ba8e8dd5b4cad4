// The rendezvous store and its HTTP server, in process and over real sockets, with the
// exact bytes Horovod's clients send and the malformed inputs they must survive.
#include <doctest/doctest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <mutex>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <dirent.h>
#include <set>
#include <vector>
#include <sys/socket.h>
#include <thread>
#include <tuple>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/network/allowlist.hpp"
#include "runtime/horovod/kv_store.hpp"
#include "runtime/horovod/rendezvous_server.hpp"
#include "runtime/observe/text.hpp"
#include "socket_util.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

namespace {

std::vector<slot_info> plan_3_plus_1() {
  return get_host_assignments({{"A", 3}, {"B", 1}}, 4);
}

// Sends raw bytes on a fresh connection, as Horovod's HTTPRequest client does, and
// returns the whole answer (the server closes with Connection: close).
using test::connect_to;

std::string read_all(int fd, std::chrono::milliseconds timeout = 3s) {
  return test::read_all(fd, timeout);
}

std::string raw(uint16_t port, const std::string& bytes, std::chrono::milliseconds t = 3s) {
  int fd = connect_to(port);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  auto out = read_all(fd, t);
  ::close(fd);
  return out;
}

std::string request(uint16_t port, const std::string& method, const std::string& path,
                    const std::string& body = "", bool with_length = true) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (with_length)
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return raw(port, req + "\r\n" + body);
}

int status_of(const std::string& response) {
  if (response.size() < 12)
    return 0;
  return std::stoi(response.substr(9, 3));
}

std::string body_of(const std::string& response) {
  auto p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

} // namespace

TEST_CASE("store: plan sizes, per-scope finish counting, no cross-scope clearing") {
  kv_store s;
  s.init(plan_3_plus_1());
  CHECK(s.scope_size("global") == 4);
  CHECK(s.scope_size("local_A") == 3);
  CHECK(s.scope_size("local_B") == 1);
  CHECK(s.scope_size("cross_0") == 2);
  CHECK(s.scope_size("cross_1") == 1);
  CHECK(s.scope_size("cross_2") == 1);
  for (auto k : {"0", "1", "2", "3"})
    s.put("global", k, "addr");
  s.put("local_B", "0", "x");
  s.finish("global", "0");
  s.finish("global", "0");  // idempotent per rank
  s.finish("local_B", "0"); // scope of one: cleared at once ...
  CHECK(s.key_count("local_B") == 0);
  CHECK(s.key_count("global") == 4); // ... without touching global's progress (P1)
  s.finish("global", "1");
  s.finish("global", "2");
  CHECK(s.key_count("global") == 4);
  s.finish("global", "3");
  CHECK(s.key_count("global") == 0);
  CHECK(s.total_bytes() == 0);
}

TEST_CASE("store: ad-hoc scopes delete the rank's keys, rank_<r> too") {
  kv_store s;
  s.init(plan_3_plus_1());
  s.put("global_process_set_hash_1f", "0", "a");
  s.put("global_process_set_hash_1f", "rank_0", "host");
  s.put("global_process_set_hash_1f", "1", "b");
  s.finish("global_process_set_hash_1f", "0");
  CHECK(!s.get("global_process_set_hash_1f", "0"));
  CHECK(!s.get("global_process_set_hash_1f", "rank_0"));
  CHECK(s.get("global_process_set_hash_1f", "1") == "b");
}

TEST_CASE("store: a new plan never serves keys of the old one and cancels waiters") {
  kv_store s;
  s.init(plan_3_plus_1());
  s.put("global", "0", "old");
  std::optional<std::string> seen = "unset";
  s.wait("global", "9", [&](const std::optional<std::string>& v) { seen = v; });
  auto gen = s.init(plan_3_plus_1());
  CHECK(gen == 2);
  CHECK(!s.get("global", "0"));
  CHECK(!seen.has_value());
}

TEST_CASE("store: waiters get the value when it is put; limits hold") {
  kv_store s{kv_store::limits{10, 14}};
  std::optional<std::string> seen;
  auto id = s.wait("g", "k", [&](const std::optional<std::string>& v) { seen = v; });
  CHECK(id != 0);
  CHECK(s.put("g", "k", "value") == kv_store::put_result::ok);
  CHECK(seen == "value");
  CHECK(s.put("g", "big", std::string(11, 'x')) == kv_store::put_result::too_large);
  CHECK(s.put("g", "k2", std::string(10, 'x')) == kv_store::put_result::store_full);
  CHECK(s.put("g", "k", std::string(10, 'x')) == kv_store::put_result::ok); // replaces
}

TEST_CASE("store: the job's key budget holds, and finished keys give theirs back") {
  kv_store s{kv_store::limits{10, 1000, 3}};
  s.init(plan_3_plus_1());
  CHECK(s.put("global", "0", "a") == kv_store::put_result::ok);
  CHECK(s.put("global", "1", "b") == kv_store::put_result::ok);
  CHECK(s.put("adhoc", "0", "c") == kv_store::put_result::ok);
  CHECK(s.put("adhoc", "1", "d") == kv_store::put_result::store_full);
  CHECK(s.key_count("adhoc") == 1);
  CHECK(s.put("global", "1", "e") == kv_store::put_result::ok); // replacing costs no key
  CHECK(s.total_keys() == 3);
  s.finish("adhoc", "0"); // an ad-hoc scope's rank deletes its keys
  CHECK(s.total_keys() == 2);
  CHECK(s.put("adhoc", "1", "d") == kv_store::put_result::ok);
  for (auto r : {"0", "1", "2", "3"})
    s.finish("global", r); // every rank finished: the scope is cleared
  CHECK(s.total_keys() == 1);
  s.init(plan_3_plus_1());
  CHECK(s.total_keys() == 0);
}

TEST_CASE("store: ad-hoc scopes cannot take the room the planned scopes rendezvous in") {
  kv_store s{kv_store::limits{100, 1000, 100}};
  s.init(plan_3_plus_1());
  int stored = 0;
  while (s.put("junk", std::to_string(stored), std::string(100, 'x')) == kv_store::put_result::ok)
    ++stored;
  CHECK(stored == 7); // 75 % of 1,000 bytes
  CHECK(s.adhoc_bytes() == 700);
  for (auto r : {"0", "1", "2"}) // the ranks' addresses still fit
    CHECK(s.put("global", r, std::string(90, 'a')) == kv_store::put_result::ok);
  CHECK(s.put("global", "3", std::string(90, 'a')) == kv_store::put_result::store_full);
  s.finish("junk", "0");
  CHECK(s.adhoc_bytes() == 600);
  CHECK(s.put("global", "3", std::string(90, 'a')) == kv_store::put_result::ok);
}

TEST_CASE("store: the hosts of each planned scope") {
  kv_store s;
  s.init(get_host_assignments({{"A", 1}, {"B", 2}}, 3));
  CHECK(*s.scope_hosts("global") == std::set<std::string>{"A", "B"});
  CHECK(*s.scope_hosts("local_B") == std::set<std::string>{"B"});
  CHECK(*s.scope_hosts("cross_0") == std::set<std::string>{"A", "B"});
  CHECK(*s.scope_hosts("cross_1") == std::set<std::string>{"B"});
  CHECK(s.scope_hosts("runfunc") == nullptr);
}

TEST_CASE("store: Horovod's process set scopes; process set 0's ranks are the plan's") {
  // the suffixes real Horovod 0.28.1 used here (its debug log: "Initializing GlooContext
  // for process set: [0,1,2,], hash: 512d4d557435ff2d")
  CHECK(horovod_process_set_suffix({0, 1, 2}) == "_process_set_hash_512d4d557435ff2d");
  CHECK(horovod_process_set_suffix({0, 1}) == "_process_set_hash_7d48533536350577");
  kv_store s;
  s.init(get_host_assignments({{"A", 1}, {"B", 2}}, 3));
  auto ps0 = horovod_process_set_suffix({0, 1, 2});
  REQUIRE(s.rank_host("global" + ps0, 2) != nullptr);
  CHECK(*s.rank_host("global" + ps0, 2) == "B");
  CHECK(*s.rank_host("local_B" + ps0, 1) == "B");
  CHECK(*s.rank_host("cross_0" + ps0, 0) == "A");
  CHECK(s.rank_host("global" + ps0, 3) == nullptr);
  // another process set: its hosts are some of its planned scope's; its ranks unknown
  auto ps = horovod_process_set_suffix({1, 2});
  CHECK(*s.scope_hosts("local_B" + ps) == std::set<std::string>{"B"});
  CHECK(*s.scope_hosts("global" + ps) == std::set<std::string>{"A", "B"});
  CHECK(s.rank_host("global" + ps, 0) == nullptr);
  CHECK_FALSE(s.ranks_known("global" + ps));
  CHECK(s.scope_hosts("global_process_set_hash_") == nullptr);
  CHECK(s.scope_hosts("global_process_set_hash_xyz") == nullptr);
  CHECK(s.scope_hosts("runfunc" + ps) == nullptr);
}

TEST_CASE("store: a PUT wakes its key's waiters in the order they came, and no others") {
  kv_store s;
  std::vector<std::string> woke;
  for (int i = 0; i < 1000; ++i) // many waiters on other keys
    s.wait("g", "other" + std::to_string(i), [&](auto&) { woke.push_back("other"); });
  s.wait("g", "k", [&](auto& v) { woke.push_back("first:" + *v); });
  auto second = s.wait("g", "k", [&](auto& v) { woke.push_back("second:" + v.value_or("none")); });
  s.wait("g", "k", [&](auto& v) { woke.push_back("third:" + *v); });
  s.wait("h", "k", [&](auto&) { woke.push_back("other scope"); });
  s.cancel_wait(second);
  CHECK(woke == std::vector<std::string>{"second:none"});
  s.put("g", "k", "v");
  CHECK(woke == std::vector<std::string>{"second:none", "first:v", "third:v"});
  s.put("g", "k", "again"); // the waiters were answered once
  CHECK(woke.size() == 3);
  s.put("g", "other7", "x");
  CHECK(woke.back() == "other");
  CHECK(woke.size() == 4);
}

TEST_CASE("server: out of descriptors, it pauses accepting instead of spinning, then resumes") {
  rendezvous_server srv{rendezvous_options{}};
  test::lowered_descriptor_limit limit{16};
  // Clients and server share this process's limit: connect until it is used up, so the
  // server's accept fails with EMFILE while connections wait in its backlog.
  std::vector<int> clients;
  for (int i = 0; i < 64; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
      break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(srv.port());
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      break;
    }
    clients.push_back(fd);
  }
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(500ms);
  ::getrusage(RUSAGE_SELF, &after);
  auto cpu_ms = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000.0
           + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1000.0;
  };
  double burned = cpu_ms(after) - cpu_ms(before);
  limit.restore();
  for (int fd : clients)
    ::close(fd);
  CHECK(srv.stats().accept_errors > 0);
  CHECK(burned < 200); // a loop re-arming accept at once burns the whole 500 ms
  std::this_thread::sleep_for(200ms);
  CHECK(status_of(request(srv.port(), "GET", "/x/y")) == 404); // accepting again
}

TEST_CASE("server: keeps the Gloo pair addresses ranks stored until the next plan, also "
          "after a rank deleted its keys") {
  rendezvous_server srv{rendezvous_options{}};
  srv.init(plan_3_plus_1());
  sockaddr_storage ss{};
  auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(40001);
  inet_pton(AF_INET, "10.0.0.5", &sa->sin_addr);
  std::string value(reinterpret_cast<const char*>(&ss), sizeof(ss));
  ssize_t seq = 3;
  value.append(reinterpret_cast<const char*>(&seq), sizeof(seq));
  CHECK(status_of(request(srv.port(), "PUT", "/global/0", value)) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_0", "hosta")) == 200);
  CHECK(status_of(request(srv.port(), "DELETE", "/global/0")) == 200);
  auto gloo = srv.gloo_endpoints();
  REQUIRE(gloo.size() == 1);
  CHECK(gloo.begin()->str() == "10.0.0.5:40001");
  srv.init(plan_3_plus_1());
  CHECK(srv.gloo_endpoints().empty());
}

TEST_CASE("server: reports each rank's Gloo rendezvous once per scope and plan: its first "
          "PUT /<scope>/rank_<r>, its DELETE /<scope>/<r>, for global and cross_<k>") {
  rendezvous_server srv{rendezvous_options{}};
  std::mutex m;
  using row = std::tuple<uint64_t, std::string, int, bool>;
  std::vector<row> seen;
  srv.on_gloo_progress([&](uint64_t g, const std::string& scope, int rank, bool connected,
                           const std::string& client) {
    std::lock_guard<std::mutex> lock(m);
    CHECK(client == "127.0.0.1"); // the caller judges who may speak for the rank
    seen.emplace_back(g, scope, rank, connected);
  });
  auto reports = [&] {
    // a request answered after the PUT or DELETE above: the report came before it
    request(srv.port(), "GET", "/global/none");
    std::lock_guard<std::mutex> lock(m);
    return seen;
  };
  srv.init(plan_3_plus_1()); // store generation 1: A:3, B:1
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_2", "hosta")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_2", "hosta")) == 200);  // again
  CHECK(status_of(request(srv.port(), "PUT", "/local_A/rank_0", "hosta")) == 200); // not reported
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_9", "hosta")) == 200);  // no such rank
  CHECK(status_of(request(srv.port(), "PUT", "/global/2", "addrs")) == 200);       // not rank_
  CHECK(status_of(request(srv.port(), "PUT", "/adhoc/rank_0", "x")) == 200);       // ad-hoc scope
  CHECK(reports() == std::vector<row>{{1, "global", 2, false}});
  CHECK(status_of(request(srv.port(), "DELETE", "/global/2")) == 200);
  // cross_0 has A's local rank 0 and B's: cross ranks 0 and 1; cross_2 only A's
  CHECK(status_of(request(srv.port(), "PUT", "/cross_0/rank_1", "hostb")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/cross_0/rank_2", "hostb")) == 200); // too big
  CHECK(status_of(request(srv.port(), "DELETE", "/cross_0/1")) == 200);
  CHECK(reports()
        == std::vector<row>{{1, "global", 2, false},
                            {1, "global", 2, true},
                            {1, "cross_0", 1, false},
                            {1, "cross_0", 1, true}});
  // a new plan: the same rank is reported again, with the store's new generation
  srv.init(plan_3_plus_1());
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_2", "hostb")) == 200);
  CHECK(reports().back() == row{2, "global", 2, false});
}

TEST_CASE("server: a lot holds a newcomer's requests, unread by the store, until its "
          "release; a closed lot drops them") {
  rendezvous_server srv{rendezvous_options{}};
  std::mutex m;
  std::vector<std::pair<uint64_t, int>> parked;
  srv.on_parked([&](uint64_t lot, int rank, const std::string& client) {
    std::lock_guard<std::mutex> lock(m);
    CHECK(client == "127.0.0.1");
    parked.emplace_back(lot, rank);
  });
  auto parked_now = [&] {
    std::lock_guard<std::mutex> lock(m);
    return parked;
  };
  // the running plan: A:3 (ranks 0-2); it has a key of its own
  srv.init(get_host_assignments({{"A", 3}}, 3));
  CHECK(status_of(request(srv.port(), "PUT", "/global/0", "rank 0's addresses")) == 200);
  // generation 2 adds B: its newcomer (rank 3) starts at lot 2 and sends what Horovod's
  // first hvd.init() sends first, with the exact bytes of its HTTPRequest client
  auto lot = srv.open_lot(2);
  CHECK(lot != srv.port());
  CHECK(srv.open_lot(2) == lot); // asked again: the same lot
  int fd = connect_to(lot);
  std::string put =
      "PUT /global/rank_3 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhostB";
  REQUIRE(::write(fd, put.data(), put.size()) == static_cast<ssize_t>(put.size()));
  // held: no answer, and the running plan's scope has neither its key nor lost its own
  CHECK(read_all(fd, 300ms).empty());
  CHECK(status_of(request(srv.port(), "GET", "/global/rank_3")) == 404);
  CHECK(status_of(request(srv.port(), "GET", "/global/0")) == 200);
  CHECK(parked_now() == std::vector<std::pair<uint64_t, int>>{{2, 3}});
  CHECK(srv.stats().held == 1);
  // released: the new plan's store takes it, and the newcomer gets its answer
  srv.release(get_host_assignments({{"A", 3}, {"B", 1}}, 4));
  srv.release_lot(2);
  auto answer = read_all(fd, 1s);
  ::close(fd);
  CHECK(status_of(answer) == 200);
  CHECK(body_of(request(srv.port(), "GET", "/global/rank_3")) == "hostB");
  CHECK(status_of(request(srv.port(), "GET", "/global/0")) == 404); // the old plan's key
  // later requests on the lot are served at once, as on the main port
  CHECK(status_of(request(lot, "GET", "/global/rank_3")) == 200);

  // a lot whose plan is replaced: its newcomer's connection is closed, nothing stored
  auto lot3 = srv.open_lot(3);
  int fd3 = connect_to(lot3);
  std::string put3 =
      "PUT /global/rank_4 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhostC";
  REQUIRE(::write(fd3, put3.data(), put3.size()) == static_cast<ssize_t>(put3.size()));
  CHECK(read_all(fd3, 300ms).empty());
  srv.close_lot(3);
  CHECK(read_all(fd3).empty()); // closed without an answer
  ::close(fd3);
  CHECK(status_of(request(srv.port(), "GET", "/global/rank_4")) == 404);
}

TEST_CASE("server: PUT, GET, 404, DELETE with Horovod's exact headers") {
  rendezvous_server srv{rendezvous_options{}};
  srv.init(plan_3_plus_1());
  std::string blob("\0\x01\x02binary\xff", 10);
  auto put = request(srv.port(), "PUT", "/global/0", blob);
  CHECK(status_of(put) == 200);
  CHECK(put.find("Content-Length: 0\r\n") != std::string::npos);
  auto get = request(srv.port(), "GET", "/global/0");
  CHECK(status_of(get) == 200);
  CHECK(get.find("Content-Length: 10\r\n") != std::string::npos);
  CHECK(body_of(get) == blob);
  auto missing = request(srv.port(), "GET", "/global/7");
  CHECK(status_of(missing) == 404);
  CHECK(missing.find("Content-Length: 0\r\n") != std::string::npos);
  CHECK(status_of(request(srv.port(), "DELETE", "/global/0")) == 200);
  // Horovod's HTTPRequest client: HTTP/1.1 with Content-Length: 0 on GET, no Connection
  // header; it reads Content-Length bytes and closes.
  auto hv = raw(srv.port(),
                "GET /global/0 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nContent-Length: 0\r\n\r\n", 500ms);
  CHECK(status_of(hv) == 200);
  CHECK(body_of(hv) == blob);
}

TEST_CASE("server: long-poll GET answers when the key arrives, 404 at its deadline") {
  rendezvous_server srv{rendezvous_options{}};
  srv.init(plan_3_plus_1());
  auto t0 = std::chrono::steady_clock::now();
  std::string got;
  std::thread waiter{[&] { got = request(srv.port(), "GET", "/global/3?wait_ms=5000"); }};
  // the waiter is registered (the server counts it) before the PUT, so the PUT's wake-up
  // is what answers it
  for (auto end = std::chrono::steady_clock::now() + 5s;
       srv.stats().long_polls < 1 && std::chrono::steady_clock::now() < end;)
    std::this_thread::sleep_for(1ms);
  CHECK_MESSAGE(srv.stats().long_polls == 1, "the long poll never registered within 5 s");
  CHECK(status_of(request(srv.port(), "PUT", "/global/3", "late")) == 200);
  waiter.join();
  CHECK(status_of(got) == 200);
  CHECK(body_of(got) == "late");
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  t0 = std::chrono::steady_clock::now();
  CHECK(status_of(request(srv.port(), "GET", "/global/never?wait_ms=300")) == 404);
  CHECK(std::chrono::steady_clock::now() - t0 >= 250ms);
}

TEST_CASE("server: malformed requests get 4xx or a closed connection, and it keeps serving") {
  rendezvous_options o;
  o.limits.max_value = 1024;
  o.request_timeout = 500ms;
  rendezvous_server srv{o};
  srv.init(plan_3_plus_1());
  auto p = srv.port();
  CHECK(status_of(request(p, "GET", "/onlyscope")) == 400);
  CHECK(status_of(request(p, "GET", "/a/b/c")) == 400); // key with '/'
  CHECK(status_of(request(p, "GET", "/a/%zz")) == 400); // bad escape
  CHECK(status_of(request(p, "GET", "/a/b?bogus=1")) == 400);
  CHECK(status_of(request(p, "PUT", "/a/b", "x", false)) == 411); // no Content-Length
  CHECK(status_of(request(p, "PUT", "/a/b", std::string(2048, 'x'))) == 413);
  CHECK(status_of(raw(p, "PUT /a/b HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n")) == 413);
  auto head = request(p, "HEAD", "/global/0");
  CHECK(status_of(head) == 405);
  CHECK(head.find("Allow: GET, PUT, DELETE") != std::string::npos);
  CHECK(status_of(request(p, "POST", "/global/0", "x")) == 405);
  CHECK(status_of(request(p, "BREW", "/global/0")) >= 400);
  CHECK(status_of(raw(p, "\x16\x03\x01garbage\r\n\r\n")) == 400);
  // A client that stalls mid-request is dropped after the request timeout.
  int fd = connect_to(p);
  std::string partial = "PUT /a/b HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly-part";
  REQUIRE(::write(fd, partial.data(), partial.size()) > 0);
  auto t0 = std::chrono::steady_clock::now();
  auto got = read_all(fd, 3s);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(got.empty());
  ::close(fd);
  // Percent-encoded '/' inside a key is a key, not a path separator.
  CHECK(status_of(request(p, "PUT", "/scope/pre%2Fkey", "v")) == 200);
  CHECK(body_of(request(p, "GET", "/scope/pre%2Fkey")) == "v");
  CHECK(status_of(request(p, "GET", "/scope/pre%2Fkey")) == 200);
  CHECK(srv.stats().rejected >= 10);
}

TEST_CASE("server: connection count is bounded") {
  rendezvous_options o;
  o.max_connections = 2;
  rendezvous_server srv{o};
  int a = connect_to(srv.port()), b = connect_to(srv.port());
  std::this_thread::sleep_for(100ms);
  int c = connect_to(srv.port());
  CHECK(read_all(c, 1s).empty()); // closed without an answer
  ::close(a);
  ::close(b);
  ::close(c);
  std::this_thread::sleep_for(100ms);
  CHECK(status_of(request(srv.port(), "GET", "/x/y")) == 404);
  CHECK(srv.stats().connections_refused == 1);
}

namespace {

// Opens a connection and sends `req` without reading the answer (a request that waits).
int send_only(uint16_t port, const std::string& req) {
  int fd = connect_to(port);
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  return fd;
}

std::string get_line(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
}

template <class Pred> void wait_for(Pred pred) {
  for (int i = 0; i < 300 && !pred(); ++i)
    std::this_thread::sleep_for(10ms);
  REQUIRE(pred());
}

} // namespace

TEST_CASE("server: held requests and long polls fill budgets of their own; ordinary requests "
          "still get answers") {
  rendezvous_options o;
  o.max_connections = 3;
  o.max_held = 3;
  o.max_long_polls = 3;
  rendezvous_server srv{o};
  srv.init(plan_3_plus_1());
  srv.enable_elastic([](const std::string&, int) {});
  std::vector<int> waiting;
  for (int i = 0; i < 3; ++i)
    waiting.push_back(send_only(srv.port(), get_line("/rank_and_size/A:" + std::to_string(i))));
  for (int i = 0; i < 3; ++i)
    waiting.push_back(send_only(srv.port(), get_line("/global/later?wait_ms=60000")));
  wait_for([&] { return srv.stats().held == 3 && srv.stats().long_polls == 3; });
  // six connections wait, yet the ordinary budget (3) is untouched
  CHECK(srv.stats().connections == 0);
  CHECK(status_of(request(srv.port(), "PUT", "/global/x", "1")) == 200);
  CHECK(body_of(request(srv.port(), "GET", "/global/x")) == "1");
  // a fourth held request is refused at once, a fourth long poll answered at once
  auto t0 = std::chrono::steady_clock::now();
  auto refused = request(srv.port(), "GET", "/rank_and_size/B:0");
  CHECK(status_of(refused) == 503);
  CHECK(body_of(refused) == "too many held rank_and_size requests\n");
  CHECK(status_of(request(srv.port(), "GET", "/global/later?wait_ms=60000")) == 404);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(srv.stats().held_refused == 1);
  CHECK(srv.stats().polls_cut == 1);
  // the waiting ones are still served: a PUT answers the polls, a release the votes
  CHECK(status_of(request(srv.port(), "PUT", "/global/later", "v")) == 200);
  srv.release(plan_3_plus_1());
  for (int fd : waiting) {
    auto got = read_all(fd, 3s);
    CHECK(status_of(got) == 200);
    ::close(fd);
  }
  wait_for([&] { return srv.stats().held == 0 && srv.stats().long_polls == 0; });
}

TEST_CASE("server: one client address cannot take every long poll or connection") {
  rendezvous_options o;
  o.loopback_exempt = false; // 127.0.0.1 plays a remote client
  o.max_long_polls_per_client = 2;
  o.max_connections_per_client = 4;
  rendezvous_server srv{o};
  srv.init(plan_3_plus_1());
  std::vector<int> polls;
  for (int i = 0; i < 2; ++i)
    polls.push_back(send_only(srv.port(), get_line("/global/k?wait_ms=60000")));
  wait_for([&] { return srv.stats().long_polls == 2; });
  CHECK(status_of(request(srv.port(), "GET", "/global/k?wait_ms=60000")) == 404); // cut
  CHECK(srv.stats().polls_cut == 1);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i)
    idle.push_back(connect_to(srv.port()));
  wait_for([&] { return srv.stats().connections == 4; });
  int extra = connect_to(srv.port());
  CHECK(read_all(extra, 1s).empty()); // refused: closed without an answer
  CHECK(srv.stats().connections_refused == 1);
  for (int fd : polls)
    ::close(fd);
  for (int fd : idle)
    ::close(fd);
  ::close(extra);
}

// Options of a server whose job has host A at 127.0.0.1 (loopback plays a remote client:
// not trusted as the driver's own host) and host B elsewhere; refusals are collected.
struct allowlisted {
  std::shared_ptr<address_allowlist> allow = std::make_shared<address_allowlist>(false);
  std::vector<std::string> reported;
  std::mutex m;
  rendezvous_options options() {
    allow->add_host("A", {"127.0.0.1"});
    allow->add_host("B", {"10.99.0.2"});
    rendezvous_options o;
    o.allowlist = allow;
    o.on_refused = [this](const std::string& what) {
      std::lock_guard g{m};
      reported.push_back(what);
    };
    return o;
  }
  std::vector<std::string> seen() {
    std::lock_guard g{m};
    return reported;
  }
};

TEST_CASE("server: a request it turns down (over the store's budget, a DELETE that names no "
          "rank) is reported once per client, method, scope and answer, whatever the key") {
  // Horovod's client gives up after three refused tries and the rank aborts without a word
  // on why; the job's operator must hear it from the server.
  allowlisted a;
  auto o = a.options();
  o.limits.max_keys = 4; // ad-hoc scopes (a process set's) get 3 of them
  rendezvous_server srv{o};
  srv.init(plan_3_plus_1());
  const std::string scope = "/global_process_set_hash_5a1e";
  for (int k = 0; k < 3; ++k)
    CHECK(status_of(request(srv.port(), "PUT", scope + "/" + std::to_string(k), "x")) == 200);
  for (int k = 3; k < 40; ++k) { // a flood of fresh keys: one report, not one a key
    auto refused = request(srv.port(), "PUT", scope + "/" + std::to_string(k), "x");
    CHECK(status_of(refused) == 413);
    CHECK(body_of(refused) == "store full\n");
  }
  CHECK(status_of(request(srv.port(), "DELETE", "/global/x")) == 400);
  CHECK(status_of(request(srv.port(), "DELETE", "/global/y")) == 400);
  CHECK(status_of(request(srv.port(), "GET", scope + "/never")) == 404); // polled for: quiet
  CHECK(a.seen() == std::vector<std::string>{
                       "the rendezvous server refused a PUT in scope global_process_set_hash_5a1e "
                       "from 127.0.0.1: 413 store full",
                       "the rendezvous server refused a DELETE in scope global from 127.0.0.1: "
                       "400 DELETE /global/<rank> names a rank of the scope (0 to 3)"});
}

TEST_CASE("server: a vote over the held budget and a connection over the server's limit are "
          "reported, once each") {
  allowlisted a;
  auto o = a.options();
  o.max_held = 2;
  o.max_connections = 2;
  rendezvous_server srv{o};
  srv.init(plan_3_plus_1());
  srv.enable_elastic([](const std::string&, int) {});
  int held0 = send_only(srv.port(), get_line("/rank_and_size/A:0"));
  int held1 = send_only(srv.port(), get_line("/rank_and_size/A:1"));
  wait_for([&] { return srv.stats().held == 2; });
  for (int i = 0; i < 2; ++i)
    CHECK(status_of(request(srv.port(), "GET", "/rank_and_size/A:2")) == 503);
  int idle0 = connect_to(srv.port()), idle1 = connect_to(srv.port());
  wait_for([&] { return srv.stats().connections == 2; });
  for (int i = 0; i < 2; ++i) {
    int over = connect_to(srv.port());
    CHECK(read_all(over, 1s).empty()); // closed without an answer
    ::close(over);
  }
  for (int fd : {held0, held1, idle0, idle1})
    ::close(fd);
  CHECK(a.seen() == std::vector<std::string>{
                       "the rendezvous server refused a vote for host A from 127.0.0.1: 503 2 "
                       "requests are held already",
                       "the rendezvous server refused a connection from 127.0.0.1: its "
                       "connections are at the server's limit (2, 1024 a client)"});
}

TEST_CASE("server: only the job's hosts connect, and a vote only from the host it names") {
  allowlisted a;
  auto& reported = a.reported;
  auto& m = a.m;
  rendezvous_server srv{a.options()};
  srv.init(plan_3_plus_1());
  srv.enable_elastic([](const std::string&, int) {});
  CHECK(status_of(request(srv.port(), "PUT", "/global/x", "1")) == 200); // A's address
  auto forged = request(srv.port(), "GET", "/rank_and_size/B:0");
  CHECK(status_of(forged) == 403);
  CHECK(body_of(forged) == "a vote for host B must come from that host\n");
  int held = send_only(srv.port(), get_line("/rank_and_size/A:0")); // its own: held
  wait_for([&] { return srv.stats().held == 1; });
  ::close(held);
  CHECK(srv.stats().strangers == 1);
  {
    std::lock_guard g{m};
    REQUIRE(reported.size() == 1);
    CHECK(reported[0]
          == "the rendezvous server refused a vote for host B from 127.0.0.1: not an "
             "address of this job's hosts");
  }
  // a server whose job has no host at this address closes the connection unanswered
  auto strict = std::make_shared<address_allowlist>(false);
  strict->add_host("B", {"10.99.0.2"});
  rendezvous_options o2;
  o2.allowlist = strict;
  rendezvous_server other{o2};
  int fd = connect_to(other.port());
  CHECK(read_all(fd, 1s).empty());
  ::close(fd);
  wait_for([&] { return other.stats().strangers == 1; });
  // the driver's own host (loopback, trusted by default) always gets in
  rendezvous_options o3;
  o3.allowlist = std::make_shared<address_allowlist>();
  rendezvous_server own{o3};
  CHECK(status_of(request(own.port(), "GET", "/x/y")) == 404);
}

TEST_CASE("server: a planned scope is read and written only by the hosts whose ranks use it") {
  allowlisted a;
  auto& reported = a.reported;
  auto& m = a.m;
  rendezvous_server srv{a.options()};
  srv.init(get_host_assignments({{"A", 1}, {"B", 2}}, 3));
  CHECK(status_of(request(srv.port(), "PUT", "/global/x", "a")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/local_A/x", "a")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/cross_0/x", "a")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/runfunc/func", "f")) == 200); // ad hoc
  auto forged = request(srv.port(), "PUT", "/local_B/x", "poison");
  CHECK(status_of(forged) == 403);
  CHECK(body_of(forged) == "scope local_B is written only by its own hosts\n");
  CHECK(status_of(request(srv.port(), "PUT", "/cross_1/x", "poison")) == 403);
  CHECK(status_of(request(srv.port(), "GET", "/local_B/x")) == 403); // nor read
  CHECK(status_of(request(srv.port(), "GET", "/local_B/x?snapshot=1")) == 403);
  CHECK(status_of(request(srv.port(), "GET", "/local_A/x")) == 200); // its own
  CHECK(status_of(request(srv.port(), "GET", "/global/x?snapshot=1")) == 200);
  std::lock_guard g{m};
  REQUIRE(reported.size() == 3); // once per address and what
  CHECK(reported[0]
        == "the rendezvous server refused a write to scope local_B from 127.0.0.1: "
           "not an address of the hosts whose ranks use that scope");
  CHECK(reported[2]
        == "the rendezvous server refused a read of scope local_B from 127.0.0.1: "
           "not an address of the hosts whose ranks use that scope");
}

TEST_CASE("server: a rank's own keys (Gloo's rank_<r> and <r>, Horovod's DELETE <r>) come "
          "from its host only, also in a scope both hosts use") {
  allowlisted a;
  rendezvous_server srv{a.options()};
  srv.init(get_host_assignments({{"A", 1}, {"B", 2}}, 3)); // global: A rank 0, B ranks 1-2
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_0", "A")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global/0", "addresses")) == 200);
  auto forged = request(srv.port(), "PUT", "/global/rank_1", "A");
  CHECK(status_of(forged) == 403);
  CHECK(body_of(forged) == "key rank_1 of scope global is written only by its rank's host\n");
  CHECK(status_of(request(srv.port(), "PUT", "/global/2", "poison")) == 403);
  CHECK(status_of(request(srv.port(), "DELETE", "/global/1")) == 403);
  CHECK(status_of(request(srv.port(), "GET", "/global/rank_1")) == 404); // nothing written
  CHECK(status_of(request(srv.port(), "DELETE", "/global/0")) == 200);
  std::lock_guard g{a.m};
  CHECK(std::count(a.reported.begin(), a.reported.end(),
                   "the rendezvous server refused a write of key rank_1 of scope global from "
                   "127.0.0.1: not an address of the host of that rank")
        == 1);
}

namespace {
// A Gloo pair address list (connectFullMesh's value for one rank) naming one listener.
std::string gloo_value(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(port);
  inet_pton(AF_INET, ip, &sa->sin_addr);
  std::string value(reinterpret_cast<const char*>(&ss), sizeof(ss));
  ssize_t seq = 1;
  value.append(reinterpret_cast<const char*>(&seq), sizeof(seq));
  return value;
}
} // namespace

TEST_CASE("server: the Gloo listeners a job's abort may cut come only from a rank's own "
          "address key, and only at its host's addresses") {
  allowlisted a; // A at 127.0.0.1, B at 10.99.0.2
  rendezvous_server srv{a.options()};
  srv.init(get_host_assignments({{"A", 1}, {"B", 1}}, 2));
  // a neighbour names a database server: in an ad-hoc scope, in another key, as its own
  // rank's listener elsewhere, and as B's rank (refused outright)
  CHECK(status_of(request(srv.port(), "PUT", "/runfunc/x", gloo_value("127.0.0.1", 5432))) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global/x", gloo_value("127.0.0.1", 5432))) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global/0", gloo_value("10.7.7.7", 5432))) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global/1", gloo_value("10.99.0.2", 5432))) == 403);
  CHECK(srv.gloo_endpoints().empty());
  // rank 0's own listener on its host
  CHECK(status_of(request(srv.port(), "PUT", "/global/0", gloo_value("127.0.0.1", 40001))) == 200);
  auto gloo = srv.gloo_endpoints();
  REQUIRE(gloo.size() == 1);
  CHECK(gloo.begin()->str() == "127.0.0.1:40001");
}

TEST_CASE("server: the Gloo listeners of Horovod's process sets are cut too (process set 0's "
          "contexts are the ones Horovod leaks)") {
  allowlisted a; // A at 127.0.0.1, B at 10.99.0.2
  rendezvous_server srv{a.options()};
  srv.init(get_host_assignments({{"A", 1}, {"B", 1}}, 2));
  auto ps0 = horovod_process_set_suffix({0, 1});
  // process set 0: rank 1 is B's, rank 0 is A's
  CHECK(status_of(request(srv.port(), "PUT", "/global" + ps0 + "/1", gloo_value("127.0.0.1", 1)))
        == 403);
  CHECK(status_of(request(srv.port(), "PUT", "/global" + ps0 + "/0", gloo_value("10.7.7.7", 2)))
        == 200);
  CHECK(srv.gloo_endpoints().empty());
  CHECK(status_of(request(srv.port(), "PUT", "/global" + ps0 + "/0",
                          gloo_value("127.0.0.1", 40002)))
        == 200);
  // another process set ({0}): a listener at the writer's host counts, others do not
  auto ps = horovod_process_set_suffix({0});
  CHECK(status_of(request(srv.port(), "PUT", "/global" + ps + "/0", gloo_value("10.99.0.2", 3)))
        == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/global" + ps + "/0",
                          gloo_value("127.0.0.1", 40003)))
        == 200);
  std::vector<std::string> got;
  for (auto& e : srv.gloo_endpoints())
    got.push_back(e.str());
  CHECK(got == std::vector<std::string>{"127.0.0.1:40002", "127.0.0.1:40003"});
}

TEST_CASE("server: Horovod workers' registrations are never read back (GET and snapshot of "
          "worker_addresses are refused), elastic or not") {
  for (bool elastic : {false, true}) {
    CAPTURE(elastic);
    allowlisted a;
    rendezvous_server srv{a.options()};
    srv.init(plan_3_plus_1());
    std::vector<std::string> registered;
    if (elastic)
      srv.enable_elastic([](const std::string&, int) {},
                         [&](const std::string& h, int lr, const std::string&) {
                           registered.push_back(slot_key(h, lr));
                         });
    CHECK(status_of(request(srv.port(), "PUT", "/worker_addresses/A:0", "pickle")) == 200);
    auto read = request(srv.port(), "GET", "/worker_addresses/A:0");
    CHECK(status_of(read) == 403);
    CHECK(body_of(read) == "worker_addresses is read by the driver only\n");
    CHECK(read.find("pickle") == std::string::npos);
    CHECK(status_of(request(srv.port(), "GET", "/worker_addresses/A:0?snapshot=1")) == 403);
    CHECK(status_of(request(srv.port(), "GET", "/worker_addresses/A:0?wait_ms=10")) == 403);
    CHECK(registered.size() == (elastic ? 1u : 0u));
  }
}

TEST_CASE("server: loopback is the driver's own machine: it speaks for the hosts whose agents "
          "run there, never for a remote host (whose own loopback address is dropped)") {
  auto allow = std::make_shared<address_allowlist>(); // loopback trusted, as in a job
  allow->add_host("L", {"127.0.0.1", "10.1.1.1"}, true);
  allow->add_host("R", {"127.0.0.1", "10.99.0.2"}, false); // R's lo is R's own
  CHECK(allow->speaks_for("L", "127.0.0.1"));
  CHECK(allow->speaks_for("L", "127.0.0.5"));
  CHECK_FALSE(allow->speaks_for("R", "127.0.0.1"));
  CHECK(allow->speaks_for("R", "10.99.0.2"));
  CHECK_FALSE(allow->speaks_for("L", "10.99.0.2"));
  rendezvous_options o;
  o.allowlist = allow;
  std::vector<std::string> reported;
  std::mutex m;
  o.on_refused = [&](const std::string& what) {
    std::lock_guard g{m};
    reported.push_back(what);
  };
  rendezvous_server srv{o};
  srv.init(get_host_assignments({{"L", 1}, {"R", 1}}, 2));
  std::vector<std::string> votes;
  srv.enable_elastic([&](const std::string& h, int lr) {
    std::lock_guard g{m};
    votes.push_back(slot_key(h, lr));
  });
  auto vote = request(srv.port(), "GET", "/rank_and_size/R:0");
  CHECK(status_of(vote) == 403);
  CHECK(body_of(vote) == "a vote for host R must come from that host\n");
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_1", "R")) == 403); // R's rank
  CHECK(status_of(request(srv.port(), "PUT", "/local_R/x", "poison")) == 403);
  CHECK(status_of(request(srv.port(), "PUT", "/worker_addresses/R:0", "pickle")) == 403);
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_0", "L")) == 200); // L's own
  int held = send_only(srv.port(), get_line("/rank_and_size/L:0"));
  wait_for([&] { return srv.stats().held == 1; });
  ::close(held);
  std::lock_guard g{m};
  CHECK(votes == std::vector<std::string>{"L:0"});
  CHECK(reported.size() == 4);
}

TEST_CASE("server: a slot whose host is not a host name (bytes that are not UTF-8, escapes, "
          "line breaks) gets 400 in every request kind; the operator sees it escaped") {
  allowlisted a;
  rendezvous_server srv{a.options()};
  srv.init(plan_3_plus_1());
  std::vector<std::string> votes, registered;
  srv.enable_elastic(
      [&](const std::string& h, int) { votes.push_back(h); },
      [&](const std::string& h, int, const std::string&) { registered.push_back(h); });
  for (auto* name : {"%ff%fe", "%1b%5b31mA%0a", "A%20B", "A%00"}) {
    CAPTURE(name);
    auto vote = request(srv.port(), "GET", fmt::format("/rank_and_size/{}:0", name));
    CHECK(status_of(vote) == 400);
    CHECK(body_of(vote).find("host's name") != std::string::npos);
    CHECK(
        status_of(request(srv.port(), "PUT", fmt::format("/worker_addresses/{}:0", name), "pickle"))
        == 400);
  }
  CHECK(status_of(request(srv.port(), "PUT", "/worker_addresses/nocolon", "pickle")) == 400);
  CHECK(status_of(request(srv.port(), "GET", "/global/x")) == 404); // the server goes on
  CHECK(votes.empty());
  CHECK(registered.empty());
  std::lock_guard g{a.m};
  bool escaped = false;
  for (auto& line : a.reported) {
    CHECK(line.find('\x1b') == std::string::npos);
    CHECK(line.find('\n') == std::string::npos);
    CHECK(line.find('\xff') == std::string::npos);
    escaped = escaped || line.find("'\\x1b[31mA\\x0a'") != std::string::npos;
  }
  CHECK(escaped);
}

TEST_CASE("kv_store: only a rank of the scope, as Horovod writes it, counts as finished") {
  CHECK(canonical_rank("0") == 0);
  CHECK(canonical_rank("17") == 17);
  CHECK_FALSE(canonical_rank("00"));
  CHECK_FALSE(canonical_rank("01"));
  CHECK_FALSE(canonical_rank("-1"));
  CHECK_FALSE(canonical_rank(""));
  CHECK_FALSE(canonical_rank("12345678"));
  kv_store s;
  s.init(plan_3_plus_1()); // global: 4 ranks
  s.put("global", "k", "v");
  for (auto* key : {"00", "000", "x", "4", "99", "rank_0", "0", "1", "2"})
    s.finish("global", key);
  CHECK(s.get("global", "k") == "v"); // 3 of 4 ranks finished: nothing cleared
  s.finish("global", "3");
  CHECK_FALSE(s.get("global", "k"));
}

TEST_CASE("server: a DELETE of a planned scope names a rank of it, from that rank's host; a "
          "rank's keys are its host's in every planned scope") {
  allowlisted a; // A at 127.0.0.1, B elsewhere
  rendezvous_server srv{a.options()};
  srv.init(get_host_assignments({{"A", 2}, {"B", 1}}, 3)); // global: A 0-1, B 2
  CHECK(status_of(request(srv.port(), "PUT", "/global/rank_0", "A")) == 200);
  for (auto* key : {"x", "00", "3", "rank_0", "-1"}) {
    CAPTURE(key);
    auto r = request(srv.port(), "DELETE", std::string{"/global/"} + key);
    CHECK(status_of(r) == 400);
    CHECK(body_of(r) == "DELETE /global/<rank> names a rank of the scope (0 to 2)\n");
  }
  CHECK(status_of(request(srv.port(), "DELETE", "/global/0")) == 200);
  CHECK(status_of(request(srv.port(), "DELETE", "/global/1")) == 200);
  CHECK(status_of(request(srv.port(), "DELETE", "/global/2")) == 403);   // B's rank
  CHECK(status_of(request(srv.port(), "GET", "/global/rank_0")) == 200); // not cleared
  // cross_0: A's local rank 0 is cross rank 0, B's is cross rank 1
  CHECK(status_of(request(srv.port(), "PUT", "/cross_0/rank_1", "A")) == 403);
  CHECK(status_of(request(srv.port(), "PUT", "/cross_0/1", "addresses")) == 403);
  CHECK(status_of(request(srv.port(), "PUT", "/cross_0/rank_0", "A")) == 200);
  CHECK(status_of(request(srv.port(), "PUT", "/cross_1/rank_0", "A")) == 200); // A's alone
  // an ad-hoc scope keeps its DELETE of any key
  CHECK(status_of(request(srv.port(), "DELETE", "/runfunc/anything")) == 200);
}

TEST_CASE("server: a request parked at a lot is judged by the access rules when it is served "
          "at the release") {
  allowlisted a;
  rendezvous_server srv{a.options()};
  srv.init(get_host_assignments({{"A", 1}, {"B", 1}}, 2));
  auto lot = srv.open_lot(2);
  // from A's address: B's rank key and A's own, both held unread at the lot
  int forged = send_only(lot, "PUT /global/rank_1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                              "Connection: close\r\n\r\nA");
  int own = send_only(lot, "PUT /global/rank_0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                           "Connection: close\r\n\r\nA");
  wait_for([&] { return srv.stats().held == 2; });
  srv.release(get_host_assignments({{"A", 1}, {"B", 1}}, 2));
  srv.release_lot(2);
  CHECK(status_of(read_all(forged)) == 403);
  CHECK(status_of(read_all(own)) == 200);
  ::close(forged);
  ::close(own);
  CHECK(status_of(request(srv.port(), "GET", "/global/rank_0")) == 200);
}

TEST_CASE("allowlist: refusals are reported once each, and at most max_reported per server, "
          "the last saying so") {
  using note = address_allowlist::refusal_note;
  address_allowlist allow;
  CHECK(allow.note_refusal("s", "x") == note::show);
  CHECK(allow.note_refusal("s", "x") == note::quiet);
  for (size_t i = 1; i + 1 < address_allowlist::max_reported; ++i)
    CHECK(allow.note_refusal("s", std::to_string(i)) == note::show);
  CHECK(allow.note_refusal("s", "the last") == note::last);
  CHECK(allow.note_refusal("s", "one more") == note::quiet);
  CHECK(allow.first_refusal("another server", "x")); // its own budget
}

TEST_CASE("text: printable escapes what a terminal would act on; host names are checked") {
  CHECK(printable("ha") == "ha");
  CHECK(printable("a\x1b[2J\nb\\") == "a\\x1b[2J\\x0ab\\x5c");
  CHECK(printable(std::string(300, 'x')).size() == 259);
  CHECK(valid_host_name("node-1.example_2"));
  CHECK_FALSE(valid_host_name(""));
  CHECK_FALSE(valid_host_name("a b"));
  CHECK_FALSE(valid_host_name("a\xff"));
  CHECK_FALSE(valid_host_name(std::string(256, 'a')));
  nlohmann::json j = {{"host", std::string("\xff\xfe")}};
  CHECK_NOTHROW(json_text(j));
  CHECK_THROWS(j.dump()); // what the job used to do with such a name
}

TEST_CASE("server: binding to a bad address is an error that names it") {
  rendezvous_options o;
  o.bind = "not-an-ip";
  CHECK_THROWS_WITH(rendezvous_server{o}, doctest::Contains("'not-an-ip'"));
}

TEST_CASE("server: snapshot GET returns every key of the scope, framed") {
  rendezvous_server srv{rendezvous_options{}};
  auto p = srv.port();
  request(p, "PUT", "/s/rank_0", "h0");
  request(p, "PUT", "/s/0", std::string("a:b\0c", 5));
  request(p, "PUT", "/other/x", "not included");
  auto got = request(p, "GET", "/s/0?snapshot=1");
  CHECK(status_of(got) == 200);
  CHECK(body_of(got) == std::string("1:05:a:b\0c6:rank_02:h0", 22));
  CHECK(status_of(request(p, "GET", "/s/9?snapshot=1")) == 404);
  CHECK(status_of(request(p, "GET", "/s/0?wait_ms=10&snapshot=1")) == 200);
}
