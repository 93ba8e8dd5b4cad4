// Aborting Gloo connections from outside: the selection rule, and a real abort between
// two child processes (one accepts like a Gloo pair's listening side, one connects), with
// a connection to a "rendezvous server" and a user's own connection that must survive.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/network/socket_abort.hpp"

using namespace cafhvd;

namespace {

tcp_endpoint ep(const char* text) {
  auto e = parse_endpoint(text);
  REQUIRE(e);
  return *e;
}

int listener(uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  REQUIRE(::listen(fd, 8) == 0);
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  port = ntohs(sa.sin_port);
  return fd;
}

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    ::_exit(3);
  return fd;
}

// In a child: echoes every byte on each descriptor until all reached EOF or an error;
// then reports through `report` (one byte per descriptor: 'E' EOF, 'R' error).
[[noreturn]] void echo_until_closed(std::vector<int> fds, int report) {
  (void)!::write(report, "S", 1); // connected
  std::vector<bool> open(fds.size(), true);
  size_t left = fds.size();
  while (left > 0) {
    std::vector<pollfd> p;
    for (auto fd : fds)
      p.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(p.data(), p.size(), 20000) <= 0)
      ::_exit(4);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!open[i] || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      char buf[64];
      auto n = ::read(fds[i], buf, sizeof(buf));
      if (n > 0) {
        (void)!::write(fds[i], buf, static_cast<size_t>(n));
        continue;
      }
      char what[2] = {static_cast<char>('0' + i), n == 0 ? 'E' : 'R'};
      (void)!::write(report, what, 2);
      open[i] = false;
      --left;
    }
  }
  ::_exit(0);
}

bool echoes(int fd) {
  if (::write(fd, "ping", 4) != 4)
    return false;
  pollfd p{fd, POLLIN, 0};
  char buf[8] = {};
  return ::poll(&p, 1, 5000) == 1 && ::read(fd, buf, sizeof(buf)) == 4
         && std::string(buf, 4) == "ping";
}

// Reads "<index><E|R>" from a child's report pipe (waits up to 5 s).
std::string next_report(int fd) {
  pollfd p{fd, POLLIN, 0};
  char buf[2] = {};
  if (::poll(&p, 1, 5000) != 1 || ::read(fd, buf, 2) != 2)
    return "none";
  return std::string(buf, 2);
}

void wait_byte(int fd) {
  pollfd p{fd, POLLIN, 0};
  char c = 0;
  REQUIRE(::poll(&p, 1, 5000) == 1);
  REQUIRE(::read(fd, &c, 1) == 1);
}

} // namespace

TEST_CASE("endpoints print and parse; IPv4 equals its IPv4-mapped IPv6 form") {
  CHECK(ep("10.0.0.1:80").str() == "10.0.0.1:80");
  CHECK(ep("[fe80::1]:443").str() == "[fe80::1]:443");
  CHECK(ep("[::ffff:10.0.0.1]:80") == ep("10.0.0.1:80"));
  CHECK(ep("0.0.0.0:5").wildcard());
  CHECK(ep("[::]:5").wildcard());
  CHECK_FALSE(parse_endpoint("10.0.0.1"));
  CHECK_FALSE(parse_endpoint("10.0.0.1:70000"));
  CHECK_FALSE(parse_endpoint("host:80"));
}

TEST_CASE("/proc/net/tcp rows: addresses in host-order words, hex ports, state, inode") {
  std::string v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   "
                   "uid  timeout inode\n"
                   "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 "
                   "    0        0 12345 1 0000000000000000 100 0 0 10 0\n"
                   "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000 "
                   " 1000        0 12346 1 0000000000000000 20 4 30 10 -1\n";
  auto rows = parse_tcp_table(v4, false);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].state == 10);
  CHECK(rows[0].local == ep("127.0.0.1:8080"));
  CHECK(rows[1].state == 1);
  CHECK(rows[1].remote == ep("127.0.0.1:50000"));
  CHECK(rows[1].inode == 12346);
  CHECK(rows[0].uid == 0);
  CHECK(rows[1].uid == 1000);
  std::string v6 = "header\n"
                   "   0: 00000000000000000000000001000000:1F90 "
                   "0000000000000000FFFF00000100007F:C350 01 00000000:00000000 00:00000000 "
                   "00000000     0        0 777 1\n";
  auto rows6 = parse_tcp_table(v6, true);
  REQUIRE(rows6.size() == 1);
  CHECK(rows6[0].local == ep("[::1]:8080"));
  CHECK(rows6[0].remote == ep("127.0.0.1:50000"));
  CHECK(rows6[0].inode == 777);
}

TEST_CASE("gloo_addresses reads the pair addresses of a connectFullMesh value") {
  auto address = [](const char* ip, uint16_t port, ssize_t seq) {
    sockaddr_storage ss{};
    auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    ::inet_pton(AF_INET, ip, &sa->sin_addr);
    std::string b(reinterpret_cast<const char*>(&ss), sizeof(ss));
    b.append(reinterpret_cast<const char*>(&seq), sizeof(seq));
    return b;
  };
  auto value = address("10.1.2.3", 40001, -1) + address("10.1.2.3", 40002, 7);
  auto got = gloo_addresses(value);
  REQUIRE(got.size() == 2);
  CHECK(got[0] == ep("10.1.2.3:40001"));
  CHECK(got[1] == ep("10.1.2.3:40002"));
  CHECK(gloo_addresses("worker-host-1").empty()); // gloo's rank_<n> value: a host name
  CHECK(gloo_addresses(value.substr(1)).empty());
  CHECK(gloo_addresses(std::string(value.size(), '\0')).empty()); // no family
}

TEST_CASE("the selection rule: an established connection with a Gloo endpoint, never the "
          "job's servers") {
  std::set<tcp_endpoint> gloo{ep("10.0.0.1:40001"), ep("10.0.0.2:40002")};
  std::set<tcp_endpoint> keep{ep("10.0.0.9:5000"), ep("0.0.0.0:6000")};
  auto conn = [](const char* l, const char* r, int state = 1) {
    return tcp_connection{1, 3, ep(l), ep(r), state};
  };
  CHECK(is_gloo_connection(conn("10.0.0.1:40001", "10.0.0.2:51000"), gloo, keep)); // accepted
  CHECK(is_gloo_connection(conn("10.0.0.1:52000", "10.0.0.2:40002"), gloo, keep)); // connected
  CHECK_FALSE(is_gloo_connection(conn("10.0.0.1:40001", "10.0.0.2:51000", 10), gloo, keep));
  CHECK_FALSE(is_gloo_connection(conn("10.0.0.1:40001", "10.0.0.2:51000", 8), gloo, keep));
  CHECK_FALSE(is_gloo_connection(conn("10.0.0.1:53000", "10.0.0.9:5000"), gloo, keep));
  CHECK_FALSE(is_gloo_connection(conn("10.0.0.1:53000", "10.0.0.7:6000"), gloo, keep));
  // the user's own connections between the same hosts
  CHECK_FALSE(is_gloo_connection(conn("10.0.0.1:8080", "10.0.0.2:51000"), gloo, keep));
  CHECK_FALSE(is_gloo_connection(conn("10.0.0.1:53000", "10.0.0.2:40001"), gloo, keep));
}

TEST_CASE("abort_gloo_connections cuts a Gloo connection between two processes and leaves "
          "the others working") {
  ::signal(SIGPIPE, SIG_IGN);
  uint16_t gloo_port = 0, user_port = 0, rdzv_port = 0;
  int rdzv = listener(rdzv_port); // the job's rendezvous server (this test)
  int gloo_listen = listener(gloo_port);
  int user_listen = listener(user_port);
  int a_report[2], b_report[2];
  REQUIRE(::pipe(a_report) == 0);
  REQUIRE(::pipe(b_report) == 0);
  // Rank A: accepts the Gloo connection (and closes the listener, as a Gloo pair does)
  // and the user's connection; it echoes until they end.
  pid_t a = ::fork();
  REQUIRE(a >= 0);
  if (a == 0) {
    ::setpgid(0, 0);
    int g = ::accept(gloo_listen, nullptr, nullptr);
    ::close(gloo_listen);
    int u = ::accept(user_listen, nullptr, nullptr);
    echo_until_closed({g, u}, a_report[1]);
  }
  ::close(gloo_listen);
  ::close(user_listen);
  // Rank B: connects to A's Gloo address, to A's user server and to the rendezvous server.
  pid_t b = ::fork();
  REQUIRE(b >= 0);
  if (b == 0) {
    ::setpgid(0, 0);
    int g = connect_to(gloo_port);
    int u = connect_to(user_port);
    int r = connect_to(rdzv_port);
    echo_until_closed({g, u, r}, b_report[1]);
  }
  int r = ::accept(rdzv, nullptr, nullptr);
  REQUIRE(r >= 0);
  wait_byte(a_report[0]);
  wait_byte(b_report[0]);
  std::set<tcp_endpoint> gloo{ep(("127.0.0.1:" + std::to_string(gloo_port)).c_str())};
  std::set<tcp_endpoint> keep{ep(("0.0.0.0:" + std::to_string(rdzv_port)).c_str())};

  SUBCASE("on the connecting side: the accepting rank reads EOF") {
    auto res = abort_gloo_connections({b}, gloo, keep);
    CHECK(res.problems.empty());
    CHECK_FALSE(res.refused);
    CHECK(res.cut == 1);
    CHECK(next_report(a_report[0]) == "0E");
  }
  SUBCASE("on the accepting side: the connecting rank reads EOF") {
    auto res = abort_gloo_connections({a}, gloo, keep);
    CHECK(res.problems.empty());
    CHECK(res.cut == 1);
    CHECK(next_report(b_report[0]) == "0E");
  }
  // The rendezvous connection still works, and so does the user's own connection
  // between the two ranks (nothing else was reported closed).
  CHECK(echoes(r));
  pollfd p[2] = {{a_report[0], POLLIN, 0}, {b_report[0], POLLIN, 0}};
  ::poll(p, 2, 200);
  char left[4] = {};
  auto na = (p[0].revents & POLLIN) ? ::read(a_report[0], left, 4) : 0;
  auto nb = (p[1].revents & POLLIN) ? ::read(b_report[0], left, 4) : 0;
  CHECK(na + nb <= 2); // only the Gloo connection's other end, at most
  int user_conns = 0;
  for (auto& c : tcp_connections_of(b))
    user_conns += c.state == 1 && c.remote.port == user_port;
  CHECK(user_conns == 1);
  CHECK(abort_gloo_connections({a, b}, {}, keep).cut == 0); // no Gloo addresses: nothing
  ::kill(a, SIGKILL);
  ::kill(b, SIGKILL);
  ::waitpid(a, nullptr, 0);
  ::waitpid(b, nullptr, 0);
  for (int fd : {r, rdzv, a_report[0], a_report[1], b_report[0], b_report[1]})
    ::close(fd);
}

TEST_CASE("shutdown_socket_of leaves a closed descriptor and one that names another socket") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  struct stat st {};
  REQUIRE(::fstat(sv[0], &st) == 0);
  auto other = shutdown_socket_of(::getpid(), sv[0], st.st_ino + 1); // reused descriptor
  CHECK_FALSE(other.cut);
  CHECK(other.problem.empty());
  CHECK(::write(sv[0], "x", 1) == 1); // still connected
  auto mine = shutdown_socket_of(::getpid(), sv[0], st.st_ino);
  CHECK(mine.cut);
  char c = 0;
  CHECK(::read(sv[1], &c, 1) == 1);
  CHECK(::read(sv[1], &c, 1) == 0); // EOF
  ::close(sv[0]);
  auto gone = shutdown_socket_of(::getpid(), sv[0], st.st_ino); // closed meanwhile
  CHECK_FALSE(gone.cut);
  CHECK(gone.problem.empty());
  ::close(sv[1]);
}
