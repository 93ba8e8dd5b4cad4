// The owner of a local client's socket (see peer_uid.hpp).
#include "runtime/network/peer_uid.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sstream>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/network/socket_abort.hpp"

namespace cafhvd {
namespace {

tcp_endpoint endpoint_of(const sockaddr_storage& ss) {
  tcp_endpoint e;
  if (ss.ss_family == AF_INET) {
    auto& in = reinterpret_cast<const sockaddr_in&>(ss);
    e.address[10] = e.address[11] = 0xff; // IPv4-mapped, as tcp_endpoint keeps IPv4
    std::memcpy(e.address.data() + 12, &in.sin_addr, 4);
    e.port = ntohs(in.sin_port);
  } else {
    auto& in6 = reinterpret_cast<const sockaddr_in6&>(ss);
    std::memcpy(e.address.data(), &in6.sin6_addr, 16);
    e.port = ntohs(in6.sin6_port);
  }
  return e;
}

bool v4(const tcp_endpoint& e) {
  static constexpr uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(e.address.data(), prefix, 12) == 0;
}

enum class diag { found, absent, unavailable };

// One exact lookup: the socket whose local end is `client` and remote end `server`.
diag ask_kernel(const tcp_endpoint& client, const tcp_endpoint& server, uint32_t& uid,
                uint64_t& inode, std::string& problem) {
  int s = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (s < 0) {
    problem = fmt::format("netlink sock_diag: {}", std::strerror(errno));
    return diag::unavailable;
  }
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.nlh.nlmsg_seq = 1;
  bool family4 = v4(client) && v4(server);
  msg.req.sdiag_family = family4 ? AF_INET : AF_INET6;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = htons(client.port);
  msg.req.id.idiag_dport = htons(server.port);
  if (family4) {
    std::memcpy(msg.req.id.idiag_src, client.address.data() + 12, 4);
    std::memcpy(msg.req.id.idiag_dst, server.address.data() + 12, 4);
  } else {
    std::memcpy(msg.req.id.idiag_src, client.address.data(), 16);
    std::memcpy(msg.req.id.idiag_dst, server.address.data(), 16);
  }
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  diag result = diag::unavailable;
  if (::sendto(s, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    problem = fmt::format("netlink sock_diag: {}", std::strerror(errno));
  } else {
    alignas(nlmsghdr) char buf[8192];
    timeval tv{1, 0}; // the kernel answers at once; never wait long for it
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    auto n = ::recv(s, buf, sizeof(buf), 0);
    if (n < 0) {
      problem = fmt::format("netlink sock_diag: {}", std::strerror(errno));
    } else {
      auto* h = reinterpret_cast<nlmsghdr*>(buf);
      auto len = static_cast<unsigned>(n);
      if (NLMSG_OK(h, len) && h->nlmsg_type == SOCK_DIAG_BY_FAMILY
          && h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
        auto* m = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
        uid = m->idiag_uid;
        inode = m->idiag_inode;
        result = diag::found;
      } else if (NLMSG_OK(h, len) && h->nlmsg_type == NLMSG_ERROR
                 && h->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr))) {
        int err = -static_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
        if (err == ENOENT)
          result = diag::absent;
        else
          problem = fmt::format("netlink sock_diag: {}", std::strerror(err));
      } else {
        problem = "netlink sock_diag: an answer of another kind";
      }
    }
  }
  ::close(s);
  return result;
}

std::string slurp(const char* path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

} // namespace

peer_owner owner_of_peer(int fd) {
  peer_owner out;
  sockaddr_storage peer{}, self{};
  socklen_t pl = sizeof(peer), sl = sizeof(self);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0
      || ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) {
    out.problem = fmt::format("the connection's addresses: {}", std::strerror(errno));
    return out;
  }
  if ((peer.ss_family != AF_INET && peer.ss_family != AF_INET6)
      || peer.ss_family != self.ss_family) {
    out.problem = "not a TCP/IP connection";
    return out;
  }
  auto client = endpoint_of(peer), server = endpoint_of(self);
  uint32_t uid = 0;
  uint64_t inode = 0;
  std::string problem;
  auto d = ask_kernel(client, server, uid, inode, problem);
  if (d == diag::unavailable) {
    // No sock_diag (a kernel without inet_diag): the same in the text tables.
    d = diag::absent;
    for (bool six : {false, true})
      for (auto& row :
           parse_tcp_table(slurp(six ? "/proc/self/net/tcp6" : "/proc/self/net/tcp"), six))
        if (row.local == client && row.remote == server) {
          uid = row.uid;
          inode = row.inode;
          d = diag::found;
        }
  }
  if (d == diag::found) {
    out.local = true;
    // A socket no process holds (the client closed it; a TIME_WAIT entry reads as uid 0)
    // names no owner.
    if (inode != 0)
      out.uid = uid;
    else
      out.problem = "the client closed its end";
  }
  return out;
}

} // namespace cafhvd
