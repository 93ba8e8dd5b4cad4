// Probe responder (one thread, poll) and the parallel prober (non-blocking connects).
#include "runtime/network/nic_probe.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <optional>
#include <set>
#include <stdexcept>
#include <sys/socket.h>
#include <thread>
#include <tuple>
#include <unistd.h>

#include <fmt/format.h>

namespace cafhvd {

namespace {

constexpr const char* greeting = "caf-hvd-probe";

std::string ntop(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

} // namespace

struct probe_responder::state {
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::string name;
  std::thread thread;
};

probe_responder::probe_responder(std::string node_name) : state_(std::make_shared<state>()) {
  auto& st = *state_;
  st.name = std::move(node_name);
  st.listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (st.listen_fd < 0 || ::bind(st.listen_fd, reinterpret_cast<sockaddr*>(&addr), len) != 0
      || ::listen(st.listen_fd, 1024) != 0
      || ::getsockname(st.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0
      || ::pipe2(st.wake, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("NIC probe responder: {}", std::strerror(errno)));
  port_ = ntohs(addr.sin_port);
  st.thread = std::thread{[&st] {
    for (;;) {
      pollfd p[2] = {{st.listen_fd, POLLIN, 0}, {st.wake[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0 && errno != EINTR)
        return;
      if (p[1].revents)
        return;
      if (!(p[0].revents & POLLIN))
        continue;
      sockaddr_in peer{};
      socklen_t plen = sizeof(peer);
      int fd = ::accept4(st.listen_fd, reinterpret_cast<sockaddr*>(&peer), &plen, SOCK_CLOEXEC);
      if (fd < 0)
        continue;
      auto answer = fmt::format("{} {} {}\n", greeting, st.name, ntop(peer));
      (void)!::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
    }
  }};
}

probe_responder::~probe_responder() {
  auto& st = *state_;
  (void)!::write(st.wake[1], "x", 1);
  st.thread.join();
  for (int fd : {st.listen_fd, st.wake[0], st.wake[1]})
    if (fd >= 0)
      ::close(fd);
}

std::vector<probe_result> probe_peers(const std::vector<interface_addr>& local,
                                      const std::vector<probe_target>& targets,
                                      std::chrono::milliseconds timeout, size_t max_in_flight) {
  using clock = std::chrono::steady_clock;
  struct probe {
    probe_result r;
    int fd = -1;
    uint16_t port = 0;
    bool started = false, done = false, connected = false;
    clock::time_point since{};
    std::string reply;
  };
  std::vector<probe> probes;
  // host-major: a host's interfaces are probed together, so the grace below (which
  // starts once every host answered) never cuts an interface before it was tried
  for (auto& t : targets)
    for (auto& ifc : local) {
      probe p;
      p.r = probe_result{ifc.name, ifc.address, t.host, t.address, false, ""};
      p.port = t.port;
      probes.push_back(std::move(p));
    }
  max_in_flight = std::max<size_t>(1, max_in_flight);
  size_t in_flight = 0, next = 0;
  auto finish = [&](probe& p, std::string error) {
    p.r.error = std::move(error);
    if (p.fd >= 0) {
      ::close(p.fd);
      p.fd = -1;
      --in_flight;
    }
    p.done = true;
  };
  // Starts the probe's connection; false when out of descriptors with others in flight
  // (it waits for one of them to end).
  auto start_probe = [&](probe& p) {
    sockaddr_in src{}, dst{};
    src.sin_family = dst.sin_family = AF_INET;
    dst.sin_port = htons(p.port);
    if (inet_pton(AF_INET, p.r.local_address.c_str(), &src.sin_addr) != 1
        || inet_pton(AF_INET, p.r.address.c_str(), &dst.sin_addr) != 1) {
      finish(p, "not an IPv4 address");
      return true;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && in_flight > 0)
        return false;
      finish(p, fmt::format("socket: {}", std::strerror(errno)));
      return true;
    }
    p.fd = fd;
    ++in_flight;
    p.started = true;
    p.since = clock::now();
    // Leave through this interface only. SO_BINDTODEVICE needs CAP_NET_RAW; without
    // it the source address binding and the responder's check still hold.
    (void)::setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, p.r.iface.c_str(),
                       static_cast<socklen_t>(p.r.iface.size()));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0)
      finish(p, fmt::format("bind {}: {}", p.r.local_address, std::strerror(errno)));
    else if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0
             && errno != EINPROGRESS)
      finish(p, std::strerror(errno));
    return true;
  };

  // At most max_in_flight sockets at once, each probe bounded by `timeout` from its own
  // start. Once every peer host answered over some interface, the other interfaces get
  // a grace of three times that round (at least 10 ms) and then count as not working:
  // an interface whose ARP goes nowhere would otherwise hold discovery for seconds.
  auto start = clock::now();
  std::optional<clock::time_point> grace_end;
  std::set<std::string> hosts_left;
  for (auto& t : targets)
    hosts_left.insert(t.host);
  if (hosts_left.empty())
    grace_end = start;
  for (;;) {
    while (next < probes.size() && in_flight < max_in_flight) {
      if (!start_probe(probes[next]))
        break;
      ++next;
    }
    if (!grace_end && hosts_left.empty() && next == probes.size()) {
      auto round = clock::now() - start;
      grace_end = clock::now() + std::max<clock::duration>(3 * round, std::chrono::milliseconds(10));
    }
    auto now = clock::now();
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    auto wake = now + timeout;
    for (size_t i = 0; i < probes.size(); ++i) {
      auto& p = probes[i];
      if (p.fd < 0)
        continue;
      if (now - p.since >= timeout || (grace_end && now >= *grace_end)) {
        finish(p, p.connected ? "connected but no answer in time"
                              : fmt::format("no connection within {} ms",
                                            std::chrono::duration_cast<std::chrono::milliseconds>(
                                                now - p.since)
                                                .count()));
        continue;
      }
      wake = std::min(wake, p.since + timeout);
      fds.push_back({p.fd, static_cast<short>(p.connected ? POLLIN : POLLOUT), 0});
      which.push_back(i);
    }
    if (grace_end)
      wake = std::min(wake, *grace_end);
    if (fds.empty()) {
      if (next < probes.size())
        continue; // descriptors freed up: start the next ones
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now);
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(1, left.count()))) < 0
        && errno != EINTR)
      break;
    for (size_t k = 0; k < fds.size(); ++k) {
      auto& p = probes[which[k]];
      if (!fds[k].revents)
        continue;
      if (!p.connected) {
        int err = 0;
        socklen_t elen = sizeof(err);
        ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &elen);
        if (err != 0) {
          finish(p, std::strerror(err));
          continue;
        }
        p.connected = true;
        continue;
      }
      char buf[256];
      auto n = ::read(p.fd, buf, sizeof(buf));
      if (n > 0) {
        p.reply.append(buf, static_cast<size_t>(n));
        if (p.reply.find('\n') == std::string::npos && p.reply.size() < 512)
          continue;
      }
      // A whole answer (or the end of it): "caf-hvd-probe NAME SEEN".
      char tag[32] = {}, name[256] = {}, seen[64] = {};
      if (std::sscanf(p.reply.c_str(), "%31s %255s %63s", tag, name, seen) != 3
          || std::string{tag} != greeting) {
        finish(p, "the peer port is not a caf-hvd probe responder");
      } else if (p.r.host != name) {
        finish(p, fmt::format("answered by node '{}', not '{}'", name, p.r.host));
      } else if (p.r.local_address != seen) {
        finish(p, fmt::format("arrived from {}, which is not {}'s address", seen, p.r.iface));
      } else {
        p.r.ok = true;
        hosts_left.erase(p.r.host);
        finish(p, "");
      }
    }
  }
  for (auto& p : probes)
    if (!p.done) {
      if (p.fd >= 0)
        finish(p, "no answer in time");
      else
        finish(p, "no answer in time");
    }
  std::vector<probe_result> out;
  for (auto& p : probes)
    out.push_back(std::move(p.r));
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
    return std::tie(a.iface, a.host, a.address) < std::tie(b.iface, b.host, b.address);
  });
  return out;
}

} // namespace cafhvd

namespace cafhvd {

std::vector<interface_addr> candidate_interfaces(const host_interfaces& h,
                                                 const std::vector<std::string>& wanted) {
  std::vector<interface_addr> out;
  for (auto& i : h.interfaces)
    if (!i.loopback
        && (wanted.empty() || std::find(wanted.begin(), wanted.end(), i.name) != wanted.end()))
      out.push_back(i);
  if (out.empty()) {
    std::string names;
    for (auto& i : h.interfaces)
      names += fmt::format("{}{} {}/{}", names.empty() ? "" : ", ", i.name, i.address, i.prefix);
    std::string asked;
    for (auto& w : wanted)
      asked += (asked.empty() ? "" : ",") + w;
    throw std::invalid_argument(
        wanted.empty()
            ? fmt::format("host {} has no non-loopback IPv4 interface (it has: {})", h.host, names)
            : fmt::format("host {} has no interface named {} (it has: {})", h.host, asked, names));
  }
  return out;
}

std::vector<nic_choice> choose_interfaces(const std::vector<host_interfaces>& hosts,
                                          const std::vector<std::vector<probe_result>>& results,
                                          const std::vector<std::string>& wanted) {
  std::vector<nic_choice> out;
  std::string problems;
  for (size_t h = 0; h < hosts.size(); ++h) {
    nic_choice c;
    c.host = hosts[h].host;
    std::vector<std::string> names;
    for (auto& r : results[h])
      if (std::find(names.begin(), names.end(), r.iface) == names.end())
        names.push_back(r.iface);
    std::sort(names.begin(), names.end());
    std::string account;
    for (auto& iface : names) {
      bool reaches_all = true;
      std::string tried;
      for (size_t p = 0; p < hosts.size(); ++p) {
        if (p == h)
          continue;
        bool reached = false;
        for (auto& r : results[h])
          if (r.iface == iface && r.host == hosts[p].host) {
            reached = reached || r.ok;
            tried += fmt::format("{}{} -> {} {}: {}", tried.empty() ? "" : "; ", r.local_address,
                                 r.host, r.address, r.ok ? "ok" : r.error);
          }
        reaches_all = reaches_all && reached;
      }
      auto line = fmt::format("\n    {}: {}", iface, tried.empty() ? "no probe" : tried);
      if (reaches_all)
        c.usable.push_back(iface);
      else
        account += line;
      if (!reaches_all && !wanted.empty())
        problems += fmt::format("\n  interface {} on host {} does not reach every other host:{}",
                                iface, c.host, line);
    }
    if (c.usable.empty() && wanted.empty())
      problems +=
          fmt::format("\n  host {}: no interface reaches every other host{}", c.host, account);
    if (!c.usable.empty())
      c.iface = c.usable.front();
    out.push_back(std::move(c));
  }
  if (!problems.empty())
    throw std::invalid_argument("NIC discovery found no common working network:" + problems);
  // The address others reach a host at: its chosen interface's address when every peer
  // reached it there, else the first address every peer reached.
  for (size_t h = 0; h < hosts.size(); ++h) {
    std::vector<std::string> candidates;
    for (auto& i : hosts[h].interfaces)
      if (i.name == out[h].iface)
        candidates.insert(candidates.begin(), i.address);
      else if (!i.loopback)
        candidates.push_back(i.address);
    for (auto& addr : candidates) {
      bool all = true;
      for (size_t p = 0; p < hosts.size() && all; ++p) {
        if (p == h)
          continue;
        bool reached = false;
        for (auto& r : results[p])
          reached = reached || (r.ok && r.host == hosts[h].host && r.address == addr);
        all = reached;
      }
      if (all) {
        out[h].address = addr;
        break;
      }
    }
    if (out[h].address.empty())
      throw std::invalid_argument(
          fmt::format("NIC discovery: no single address of host {} was reached by every other host",
                      hosts[h].host));
  }
  return out;
}

} // namespace cafhvd

namespace cafhvd {

std::vector<std::string>
check_tcp_reachable(const std::vector<std::pair<std::string, uint16_t>>& endpoints,
                    std::chrono::milliseconds timeout) {
  std::vector<std::string> out(endpoints.size());
  std::vector<int> fds(endpoints.size(), -1);
  for (size_t i = 0; i < endpoints.size(); ++i) {
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(endpoints[i].second);
    if (inet_pton(AF_INET, endpoints[i].first.c_str(), &dst.sin_addr) != 1) {
      out[i] = "not an IPv4 address";
      continue;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0
        && errno != EINPROGRESS) {
      out[i] = std::strerror(errno);
      ::close(fd);
      continue;
    }
    fds[i] = fd;
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i] >= 0) {
        p.push_back({fds[i], POLLOUT, 0});
        which.push_back(i);
      }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (p.empty() || left.count() <= 0)
      break;
    if (::poll(p.data(), p.size(), static_cast<int>(left.count())) < 0 && errno != EINTR)
      break;
    for (size_t k = 0; k < p.size(); ++k) {
      if (!p[k].revents)
        continue;
      auto i = which[k];
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0)
        out[i] = std::strerror(err);
      ::close(fds[i]);
      fds[i] = -1;
    }
  }
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i] >= 0) {
      out[i] = fmt::format("no TCP connection within {} s (host down, or its network "
                           "interface down?)",
                           timeout.count() / 1000.0);
      ::close(fds[i]);
    }
  return out;
}

} // namespace cafhvd
