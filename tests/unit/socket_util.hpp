// Plain-socket helpers for tests that talk HTTP to our servers byte for byte.
#pragma once

#include <arpa/inet.h>
#include <chrono>
#include <dirent.h>
#include <sys/resource.h>
#include <cstdint>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

namespace cafhvd::test {

/// Lowers this process's soft descriptor limit to what it holds now plus `spare`, until
/// restore() or the end of its scope.
class lowered_descriptor_limit {
public:
  explicit lowered_descriptor_limit(size_t spare) {
    size_t open_fds = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (::readdir(d))
        ++open_fds;
      ::closedir(d);
    }
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &old_) == 0);
    rlimit low = old_;
    low.rlim_cur = static_cast<rlim_t>(open_fds + spare);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  }
  ~lowered_descriptor_limit() { restore(); }
  void restore() {
    if (!restored_)
      ::setrlimit(RLIMIT_NOFILE, &old_);
    restored_ = true;
  }

private:
  rlimit old_{};
  bool restored_ = false;
};

inline int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

/// Reads until the peer closes or `timeout` passes; returns what arrived.
inline std::string read_all(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  char buf[65536];
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      break;
    auto n = ::read(fd, buf, sizeof(buf));
    if (n <= 0)
      break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

} // namespace cafhvd::test
