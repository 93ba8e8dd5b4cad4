// Enumerates IPv4 interfaces with getifaddrs; routes and name resolution.
#include "runtime/network/nic.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <netdb.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace cafhvd {

std::vector<interface_addr> list_interfaces() {
  std::vector<interface_addr> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return out;
  for (auto p = list; p; p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || !(p->ifa_flags & IFF_UP))
      continue;
    char buf[INET_ADDRSTRLEN] = {};
    auto sin = reinterpret_cast<sockaddr_in*>(p->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    int prefix = 0;
    if (p->ifa_netmask)
      prefix = __builtin_popcount(reinterpret_cast<sockaddr_in*>(p->ifa_netmask)->sin_addr.s_addr);
    out.push_back({p->ifa_name, buf, prefix, (p->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
    return a.name != b.name ? a.name < b.name : a.address < b.address;
  });
  return out;
}

std::optional<std::string> local_address_towards(const std::string& peer) {
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(9);
  if (inet_pton(AF_INET, peer.c_str(), &dst.sin_addr) != 1)
    return std::nullopt;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return std::nullopt;
  std::optional<std::string> out;
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) == 0
      && ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf));
    out = buf;
  }
  ::close(fd);
  return out;
}

bool is_loopback_address(const std::string& ipv4) {
  in_addr a{};
  return inet_pton(AF_INET, ipv4.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

std::optional<std::string> resolve_ipv4(const std::string& host, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res) {
    if (error)
      *error = rc != 0 ? gai_strerror(rc) : "no address";
    return std::nullopt;
  }
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::string{buf};
}

} // namespace cafhvd
