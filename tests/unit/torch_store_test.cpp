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

#include "runtime/torch_store.hpp"

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
  void set(const std::string& k, const std::string& v) {
    std::string q(1, '\x00');
    str(q, k);
    str(q, v);
    send(q);
  }
  std::string get(const std::string& k) {
    std::string q(1, '\x02');
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
