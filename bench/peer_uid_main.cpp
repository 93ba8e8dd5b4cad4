// What the servers' owner lookup costs per accepted connection: owner_of_peer on one
// loopback connection, N times (usage: peer-uid-cost [N]).
#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/network/peer_uid.hpp"

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(l, 8) != 0
      || ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("listen on loopback");
    return 1;
  }
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::perror("connect");
    return 1;
  }
  int s = ::accept(l, nullptr, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    if (!cafhvd::owner_of_peer(s).uid) {
      std::fprintf(stderr, "no owner found for a live loopback connection\n");
      return 1;
    }
  auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
  std::printf("owner_of_peer: %.1f us per accepted connection (%d lookups)\n", us.count() / n, n);
  ::close(s);
  ::close(c);
  ::close(l);
  return 0;
}
