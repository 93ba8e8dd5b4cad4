// Whose a local client is: the owner of the client's socket, read from the kernel, for
// connections from this process, from a child of another account, over IPv6, and from a
// client that closed before it was asked about; and the allowlist's rule on top of it.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/network/allowlist.hpp"
#include "runtime/network/peer_uid.hpp"

using namespace cafhvd;

namespace {

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

// A listening socket on loopback (IPv4 or IPv6) and its address.
sockaddr_storage listen_on(bool v6, fd_guard& l) {
  sockaddr_storage ss{};
  socklen_t len;
  if (v6) {
    auto& a = reinterpret_cast<sockaddr_in6&>(ss);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    len = sizeof(a);
  } else {
    auto& a = reinterpret_cast<sockaddr_in&>(ss);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(a);
  }
  l.fd = ::socket(ss.ss_family, SOCK_STREAM, 0);
  REQUIRE(l.fd >= 0);
  REQUIRE(::bind(l.fd, reinterpret_cast<sockaddr*>(&ss), len) == 0);
  REQUIRE(::listen(l.fd, 8) == 0);
  ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ss;
}

int connect_to(const sockaddr_storage& ss) {
  int c = ::socket(ss.ss_family, SOCK_STREAM, 0);
  auto len = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  REQUIRE(::connect(c, reinterpret_cast<const sockaddr*>(&ss), static_cast<socklen_t>(len)) == 0);
  return c;
}

} // namespace

TEST_CASE("the owner of a local client's socket: this process's own account") {
  for (bool v6 : {false, true}) {
    CAPTURE(v6);
    fd_guard l, c, a;
    auto ss = listen_on(v6, l);
    c.fd = connect_to(ss);
    a.fd = ::accept(l.fd, nullptr, nullptr);
    REQUIRE(a.fd >= 0);
    auto o = owner_of_peer(a.fd);
    CHECK(o.local);
    REQUIRE(o.uid);
    CHECK(*o.uid == ::geteuid());
    CHECK(o.problem.empty());
  }
}

TEST_CASE("the owner of a local client's socket: a process of another account") {
  if (::geteuid() != 0)
    return; // switching accounts needs root
  fd_guard l;
  auto ss = listen_on(false, l);
  int ready[2], release[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(release) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::setresgid(54321, 54321, 54321) != 0 || ::setresuid(54321, 54321, 54321) != 0)
      ::_exit(2);
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(c, reinterpret_cast<const sockaddr*>(&ss), sizeof(sockaddr_in)) != 0)
      ::_exit(3);
    char x = 1;
    (void)!::write(ready[1], &x, 1);
    (void)!::read(release[0], &x, 1);
    ::_exit(0);
  }
  char x = 0;
  REQUIRE(::read(ready[0], &x, 1) == 1);
  fd_guard a;
  a.fd = ::accept(l.fd, nullptr, nullptr);
  auto o = owner_of_peer(a.fd);
  (void)!::write(release[1], &x, 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int fd : {ready[0], ready[1], release[0], release[1]})
    ::close(fd);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(o.local);
  REQUIRE(o.uid);
  CHECK(*o.uid == 54321u);
}

TEST_CASE("the owner of a local client's socket: a client that closed names no owner") {
  fd_guard l, a;
  auto ss = listen_on(false, l);
  int c = connect_to(ss);
  ::close(c); // before the server accepts: no process holds the client's end
  a.fd = ::accept(l.fd, nullptr, nullptr);
  REQUIRE(a.fd >= 0);
  auto o = owner_of_peer(a.fd);
  CHECK_FALSE(o.uid); // not uid 0 of a TIME_WAIT entry
}

TEST_CASE("allowlist: a client on this machine is admitted by its socket's account") {
  address_allowlist list;
  auto me = static_cast<uint32_t>(::geteuid());
  peer_owner alice{true, 20001u, ""}, driver{true, me, ""}, root{true, 0u, ""};
  peer_owner unknown{true, std::nullopt, "the client closed its end"};
  peer_owner remote{false, std::nullopt, ""};
  CHECK(list.refusal("127.0.0.1", driver).empty());
  CHECK(list.refusal("127.0.0.1", root).empty());
  CHECK(list.refusal("127.0.0.1", alice)
        == "its socket on this machine is uid 20001's, not the driver's or an account this "
           "job's ranks run as here");
  CHECK(list.refusal("127.0.0.1", unknown)
        == "the owner of its socket on this machine is not known (the client closed its end)");
  CHECK(list.refusal("127.0.0.1", remote)
        == "its socket was not found on this machine (it closed)");
  // a remote host's ranks run as alice there: no local process of hers is admitted
  list.add_host("far", {"10.0.0.2"}, false, 20001u);
  CHECK_FALSE(list.refusal("127.0.0.1", alice).empty());
  CHECK(list.refusal("10.0.0.2", remote).empty());
  CHECK(list.refusal("10.0.0.3", remote) == "not an address of this job's hosts");
  // a host on this machine whose ranks run as alice
  list.add_host("near", {"127.0.0.1"}, true, 20001u);
  CHECK(list.refusal("127.0.0.1", alice).empty());
  CHECK_FALSE(list.refusal("127.0.0.1", peer_owner{true, 20002u, ""}).empty());
}
