// The torch TCPStore server, spoken to in torch 1.13's wire format over real sockets.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <memory>
#include <mutex>

#include "runtime/torch/torch_store.hpp"
#include "socket_util.hpp"

using namespace cafhvd;

namespace {

struct client {
  int fd;
  explicit client(uint16_t port) : fd(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~client() { ::close(fd); }
  template <class T> void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(std::string& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out += s;
  }
  void send(const std::string& s) { REQUIRE(::write(fd, s.data(), s.size()) == (ssize_t)s.size()); }
  std::string recv(size_t n) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      auto r = ::read(fd, out.data() + got, n - got);
      if (r <= 0)
        return out.substr(0, got);
      got += static_cast<size_t>(r);
    }
    return out;
  }
  int64_t add(const std::string& k, int64_t v) {
    std::string q(1, '\x03');
    str(q, k);
    put<int64_t>(q, v);
    send(q);
    auto r = recv(8);
    int64_t out = 0;
    std::memcpy(&out, r.data(), 8);
    return out;
  }
  // Type codes of the dialect (torch 1.13's by default).
  char set_type = '\x00', get_type = '\x02', wait_type = '\x05';
  bool wait_before_get = false; // torch 2.x's client WAITs on the key first
  void set(const std::string& k, const std::string& v) {
    std::string q(1, set_type);
    str(q, k);
    str(q, v);
    send(q);
  }
  std::string get(const std::string& k) {
    if (wait_before_get)
      CHECK(keys_query(wait_type, k) == std::string(1, '\x00'));
    std::string q(1, get_type);
    str(q, k);
    send(q);
    auto len = recv(8);
    uint64_t n = 0;
    std::memcpy(&n, len.data(), 8);
    return recv(n);
  }
  std::string keys_query(char type, const std::string& k) {
    std::string q(1, type);
    put<uint64_t>(q, 1);
    str(q, k);
    send(q);
    return recv(1);
  }
};

} // namespace

TEST_CASE("torch store: add, set, get, check and a wait that ends when the key is set") {
  torch_store_server srv{"127.0.0.1", 0};
  client a{srv.port()}, b{srv.port()};
  CHECK(a.add("init/", 1) == 1);
  CHECK(b.add("init/", 1) == 2);
  a.set("k", std::string("v\0w", 3)); // SET has no answer; torch's get() waits first
  CHECK(b.keys_query('\x05', "k") == std::string(1, '\x00'));
  CHECK(b.get("k") == std::string("v\0w", 3));
  CHECK(b.keys_query('\x04', "k") == std::string(1, '\x00'));       // READY
  CHECK(b.keys_query('\x04', "missing") == std::string(1, '\x01')); // NOT_READY
  std::string waited;
  std::thread t{[&] { waited = b.keys_query('\x05', "late"); }};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  a.set("late", "x");
  t.join();
  CHECK(waited == std::string(1, '\x00')); // STOP_WAITING
  CHECK(a.get("late") == "x");             // same connection: in order after its SET
}

TEST_CASE("torch store: garbage ends that connection only") {
  torch_store_server srv{"127.0.0.1", 0};
  {
    client bad{srv.port()};
    bad.send(std::string("\x07\xff\xff\xff\xff\xff\xff\xff\xff", 9));
    CHECK(bad.recv(1).empty());
  }
  client good{srv.port()};
  CHECK(good.add("n", 5) == 5);
}

namespace {

// A torch 2.2+ client: VALIDATE then (2.5+) PING on connect, SET=1, GET=3, WAIT=6.
struct client2 : client {
  explicit client2(uint16_t port) : client(port) {
    set_type = '\x01';
    get_type = '\x03';
    wait_type = '\x06';
    wait_before_get = true;
    std::string q(1, '\x00');
    put<uint32_t>(q, 0x3C85F7CE);
    q.push_back('\x0d');
    put<uint32_t>(q, 4242);
    send(q);
    auto nonce = recv(4);
    uint32_t n = 0;
    REQUIRE(nonce.size() == 4);
    std::memcpy(&n, nonce.data(), 4);
    CHECK(n == 4242);
  }
};

} // namespace

TEST_CASE("torch store over sockets: a 2.x and a 1.13 client in one store") {
  torch_store_server srv{"127.0.0.1", 0};
  client2 modern{srv.port()};
  client legacy{srv.port()};
  legacy.set("/from113", "a");
  CHECK(modern.get("/from113") == "a");
  std::string waited;
  std::thread t{[&] { waited = legacy.keys_query('\x05', "/from2x"); }};
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  modern.set("/from2x", "b");
  t.join();
  CHECK(waited == std::string(1, '\x00'));
  CHECK(legacy.get("/from2x") == "b");
}

TEST_CASE("torch store over sockets: a pending wait is cancelled on the same connection") {
  torch_store_server srv{"127.0.0.1", 0};
  client2 c{srv.port()};
  std::string q(1, '\x06');
  c.put<uint64_t>(q, 1);
  c.str(q, "/never");
  c.send(q);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  c.send(std::string(1, '\x0c')); // CANCEL_WAIT, as torch's client sends on its timeout
  CHECK(c.recv(1) == std::string(1, '\x01'));
  c.set("/after", "ok"); // the connection goes on
  CHECK(c.get("/after") == "ok");
}

TEST_CASE("torch store over sockets: a protocol violation is reported and closes that client") {
  std::mutex m;
  std::vector<std::string> problems;
  torch_store_server srv{"127.0.0.1", 0, [&](const std::string& p) {
                           std::lock_guard<std::mutex> g{m};
                           problems.push_back(p);
                         }};
  {
    client2 bad{srv.port()};
    bad.send(std::string(1, '\x63')); // type 99
    CHECK(bad.recv(1).empty());
  }
  client2 good{srv.port()};
  good.set("/k", "v");
  CHECK(good.get("/k") == "v");
  std::lock_guard<std::mutex> g{m};
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("query type 99") != std::string::npos);
  CHECK(problems[0].find("torch 2.2+") != std::string::npos);
}

TEST_CASE("torch store over sockets: clear() starts a fresh key space") {
  torch_store_server srv{"127.0.0.1", 0};
  client2 c{srv.port()};
  c.set("/gen1", "x");
  CHECK(c.get("/gen1") == "x");
  srv.clear();
  CHECK(c.keys_query('\x05', "/gen1") == std::string(1, '\x01')); // CHECK: NOT_READY
}

TEST_CASE("torch store over sockets: one client address cannot take every connection") {
  torch_store_limits limits;
  limits.max_connections_per_client = 3;
  limits.loopback_exempt = false; // loopback plays a remote client here
  torch_store_server srv{"127.0.0.1", 0, {}, limits};
  std::vector<std::unique_ptr<client>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<client>(srv.port()));
    CHECK(held.back()->add("/n", 1) == i + 1);
  }
  // The fourth is closed at once, unanswered.
  int fd = test::connect_to(srv.port());
  std::string q(1, '\x03');
  uint64_t len = 2;
  q.append(reinterpret_cast<const char*>(&len), 8);
  q += "/n";
  int64_t one = 1;
  q.append(reinterpret_cast<const char*>(&one), 8);
  (void)::write(fd, q.data(), q.size());
  CHECK(test::read_all(fd, std::chrono::seconds(2)).empty());
  ::close(fd);
  // One closes: a new connection gets its place.
  held.pop_back();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  client again{srv.port()};
  CHECK(again.add("/n", 1) == 4);
}
