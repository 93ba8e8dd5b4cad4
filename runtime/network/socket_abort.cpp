// /proc parsing and pidfd_getfd + shutdown for aborting a rank's Gloo connections.
#include "runtime/network/socket_abort.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <netinet/in.h>
#include <sstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace cafhvd {

namespace {

tcp_endpoint from_v4(const uint8_t* a, uint16_t port) {
  tcp_endpoint e;
  e.address[10] = e.address[11] = 0xff;
  std::memcpy(e.address.data() + 12, a, 4);
  e.port = port;
  return e;
}

bool is_v4(const tcp_endpoint& e) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(e.address.data(), prefix, 12) == 0;
}

int hex(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

// "0100007F:1F90" (IPv4) or 32 hex digits and a port (IPv6): the kernel prints the
// address as 32-bit words in host byte order.
std::optional<tcp_endpoint> parse_proc_endpoint(std::string_view s, bool v6) {
  auto colon = s.find(':');
  size_t digits = v6 ? 32 : 8;
  if (colon != digits || s.size() != digits + 5)
    return std::nullopt;
  uint8_t raw[16];
  for (size_t word = 0; word < digits / 8; ++word) {
    uint32_t v = 0;
    for (size_t i = 0; i < 8; ++i) {
      int h = hex(s[word * 8 + i]);
      if (h < 0)
        return std::nullopt;
      v = v << 4 | static_cast<uint32_t>(h);
    }
    std::memcpy(raw + word * 4, &v, 4); // back to the bytes the kernel had in memory
  }
  uint32_t port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    int h = hex(s[i]);
    if (h < 0)
      return std::nullopt;
    port = port << 4 | static_cast<uint32_t>(h);
  }
  if (!v6)
    return from_v4(raw, static_cast<uint16_t>(port));
  tcp_endpoint e;
  std::memcpy(e.address.data(), raw, 16);
  e.port = static_cast<uint16_t>(port);
  return e;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool matches(const tcp_endpoint& e, const std::set<tcp_endpoint>& set) {
  if (set.count(e))
    return true;
  for (auto& k : set)
    if (k.port == e.port && k.wildcard())
      return true;
  return false;
}

} // namespace

bool tcp_endpoint::wildcard() const {
  tcp_endpoint any4 = from_v4(reinterpret_cast<const uint8_t*>("\0\0\0\0"), port);
  return address == any4.address || address == std::array<uint8_t, 16>{};
}

std::string tcp_endpoint::str() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4(*this)) {
    ::inet_ntop(AF_INET, address.data() + 12, buf, sizeof(buf));
    return fmt::format("{}:{}", buf, port);
  }
  ::inet_ntop(AF_INET6, address.data(), buf, sizeof(buf));
  return fmt::format("[{}]:{}", buf, port);
}

std::optional<tcp_endpoint> parse_endpoint(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos)
    return std::nullopt;
  auto host = text.substr(0, colon);
  auto port_text = text.substr(colon + 1);
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc{} || p != port_text.data() + port_text.size() || port > 65535
      || port_text.empty())
    return std::nullopt;
  tcp_endpoint e;
  e.port = static_cast<uint16_t>(port);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    std::string h{host.substr(1, host.size() - 2)};
    if (::inet_pton(AF_INET6, h.c_str(), e.address.data()) != 1)
      return std::nullopt;
    return e;
  }
  std::string h{host};
  uint8_t a[4];
  if (::inet_pton(AF_INET, h.c_str(), a) != 1)
    return std::nullopt;
  return from_v4(a, e.port);
}

std::vector<tcp_endpoint> gloo_addresses(std::string_view value) {
  // gloo/transport/tcp/address.h: struct Impl { sockaddr_storage ss; ssize_t seq; }
  constexpr size_t size = sizeof(sockaddr_storage) + sizeof(ssize_t);
  std::vector<tcp_endpoint> out;
  if (value.empty() || value.size() % size != 0)
    return {};
  for (size_t off = 0; off < value.size(); off += size) {
    sockaddr_storage ss;
    std::memcpy(&ss, value.data() + off, sizeof(ss));
    if (ss.ss_family == AF_INET) {
      sockaddr_in sa;
      std::memcpy(&sa, &ss, sizeof(sa));
      out.push_back(from_v4(reinterpret_cast<const uint8_t*>(&sa.sin_addr), ntohs(sa.sin_port)));
    } else if (ss.ss_family == AF_INET6) {
      sockaddr_in6 sa;
      std::memcpy(&sa, &ss, sizeof(sa));
      tcp_endpoint e;
      std::memcpy(e.address.data(), &sa.sin6_addr, 16);
      e.port = ntohs(sa.sin6_port);
      out.push_back(e);
    } else {
      return {};
    }
    if (out.back().port == 0)
      return {};
  }
  return out;
}

std::vector<tcp_row> parse_tcp_table(std::string_view text, bool v6) {
  std::vector<tcp_row> rows;
  std::istringstream in{std::string{text}};
  std::string line;
  std::getline(in, line); // header
  while (std::getline(in, line)) {
    std::istringstream f{line};
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout
          >> inode))
      continue;
    auto l = parse_proc_endpoint(local, v6);
    auto r = parse_proc_endpoint(remote, v6);
    if (!l || !r)
      continue;
    tcp_row row;
    row.local = *l;
    row.remote = *r;
    row.state = static_cast<int>(std::strtol(state.c_str(), nullptr, 16));
    row.inode = std::strtoull(inode.c_str(), nullptr, 10);
    row.uid = static_cast<uint32_t>(std::strtoul(uid.c_str(), nullptr, 10));
    rows.push_back(row);
  }
  return rows;
}

std::vector<tcp_connection> tcp_connections_of(pid_t pid, std::string* problem) {
  std::map<uint64_t, int> fds; // socket inode -> descriptor
  auto dir = fmt::format("/proc/{}/fd", pid);
  DIR* d = ::opendir(dir.c_str());
  if (!d && (errno == EACCES || errno == EPERM) && problem)
    *problem = fmt::format("cannot list the descriptors of pid {}: {} (a rank of another "
                           "account: the agent needs root or CAP_DAC_READ_SEARCH)",
                           pid, std::strerror(errno));
  if (d) {
    while (auto* e = ::readdir(d)) {
      char link[64] = {};
      auto path = dir + "/" + e->d_name;
      auto n = ::readlink(path.c_str(), link, sizeof(link) - 1);
      if (n <= 0 || std::strncmp(link, "socket:[", 8) != 0)
        continue;
      fds.emplace(std::strtoull(link + 8, nullptr, 10), std::atoi(e->d_name));
    }
    ::closedir(d);
  }
  std::vector<tcp_connection> out;
  if (fds.empty())
    return out;
  for (bool v6 : {false, true})
    for (auto& row :
         parse_tcp_table(read_file(fmt::format("/proc/{}/net/tcp{}", pid, v6 ? "6" : "")), v6))
      if (auto it = fds.find(row.inode); it != fds.end() && row.inode != 0)
        out.push_back(tcp_connection{pid, it->second, row.local, row.remote, row.state, row.inode});
  return out;
}

std::vector<pid_t> process_group_members(pid_t pgid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0')
      continue;
    auto stat = read_file(fmt::format("/proc/{}/stat", pid));
    auto paren = stat.rfind(')'); // the command name may contain anything
    if (paren == std::string::npos)
      continue;
    std::istringstream f{stat.substr(paren + 1)};
    std::string state;
    long ppid = 0, pgrp = 0;
    if (f >> state >> ppid >> pgrp && pgrp == pgid)
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

bool is_gloo_connection(const tcp_connection& c, const std::set<tcp_endpoint>& gloo,
                        const std::set<tcp_endpoint>& keep) {
  constexpr int established = 1;
  if (c.state != established || matches(c.local, keep) || matches(c.remote, keep))
    return false;
  return gloo.count(c.local) || gloo.count(c.remote);
}

socket_shutdown shutdown_socket_of(pid_t pid, int fd, uint64_t inode) {
  socket_shutdown r;
  auto failed = [&](const char* call) {
    int e = errno;
    r.refused = e == EPERM || e == ENOSYS || e == EACCES;
    r.problem = fmt::format("{} (pid {}, fd {}): {}", call, pid, fd, std::strerror(e));
    return r;
  };
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0)
    return errno == ESRCH ? r : failed("pidfd_open"); // ESRCH: the process ended
  int copy = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  if (copy < 0) {
    // EBADF: closed meanwhile (Gloo closes a pair that failed first); ESRCH: ended
    if (errno != EBADF && errno != ESRCH)
      failed("pidfd_getfd");
    ::close(pidfd);
    return r;
  }
  struct stat st {};
  if (inode == 0 || (::fstat(copy, &st) == 0 && st.st_ino == inode)) {
    if (::shutdown(copy, SHUT_RDWR) == 0)
      r.cut = true;
    else if (errno != ENOTCONN)
      failed("shutdown");
  }
  ::close(copy); // only our copy: the process keeps its descriptor
  ::close(pidfd);
  return r;
}

socket_abort_result abort_gloo_connections(const std::vector<pid_t>& pgids,
                                           const std::set<tcp_endpoint>& gloo,
                                           const std::set<tcp_endpoint>& keep) {
  socket_abort_result r;
  for (auto pgid : pgids)
    for (auto pid : process_group_members(pgid)) {
      std::string listing;
      auto conns = tcp_connections_of(pid, &listing);
      if (!listing.empty()) {
        r.refused = true;
        r.problems.push_back(listing);
        return r; // the same refusal would come for every other process
      }
      for (auto& c : conns) {
        if (!is_gloo_connection(c, gloo, keep))
          continue;
        auto one = shutdown_socket_of(pid, c.fd, c.inode);
        r.cut += one.cut;
        r.refused = r.refused || one.refused;
        if (!one.problem.empty())
          r.problems.push_back(
              fmt::format("{} -> {}: {}", c.local.str(), c.remote.str(), one.problem));
        if (r.refused)
          return r; // the same refusal would come for every other socket
      }
    }
  return r;
}

} // namespace cafhvd
