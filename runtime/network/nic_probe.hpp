// NIC discovery probes. Every node runs a responder; every node probes every peer
// address from every local interface at once (all-to-all rather than Horovod's ring:
// each host pair is verified in both directions, an interface that only works one way
// is caught, and all probes run in parallel so the cost is one round trip, not n).
// A probe counts only when the peer answered with its own name and saw our connection
// come from the address of the local interface under test.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/network/nic.hpp"

namespace cafhvd {

/// Answers every TCP connection with "caf-hvd-probe <node name> <address it saw>\n".
class probe_responder {
public:
  /// Listens on every IPv4 address of this host, on a free port. Throws on failure.
  explicit probe_responder(std::string node_name);
  ~probe_responder();
  probe_responder(const probe_responder&) = delete;
  probe_responder& operator=(const probe_responder&) = delete;
  uint16_t port() const { return port_; }

private:
  struct state;
  std::shared_ptr<state> state_;
  uint16_t port_ = 0;
};

/// One address of a peer node to probe.
struct probe_target {
  std::string host;    // the peer's node name
  std::string address; // one of its interface addresses
  uint16_t port = 0;   // its responder
};

struct probe_result {
  std::string iface; // local interface under test
  std::string local_address;
  std::string host;    // peer node
  std::string address; // peer address
  bool ok = false;
  std::string error; // why not, when !ok
};

/// Probes every target from every interface in `local`, at most `max_in_flight` sockets
/// at once (a host with hundreds of peers stays within its descriptors; when they run
/// out anyway, the rest wait for probes in flight); each probe ends `timeout` after it
/// started at the latest. Results are ordered by (iface, host, address).
std::vector<probe_result> probe_peers(const std::vector<interface_addr>& local,
                                      const std::vector<probe_target>& targets,
                                      std::chrono::milliseconds timeout,
                                      size_t max_in_flight = 256);

} // namespace cafhvd

namespace cafhvd {

/// What one host offers: its name and its up IPv4 interfaces.
struct host_interfaces {
  std::string host;
  std::vector<interface_addr> interfaces;
};

/// The outcome of discovery for one host.
struct nic_choice {
  std::string host;
  std::string iface;               // for Gloo (HOROVOD_GLOO_IFACE)
  std::vector<std::string> usable; // every interface that reaches all peers, by name
  std::string address;             // the address the other hosts reach this host at
};

/// Interfaces a probe should use on a host: non-loopback, and, when `wanted` is not
/// empty, only the named ones. Throws std::invalid_argument when the host has none of
/// the named interfaces.
std::vector<interface_addr> candidate_interfaces(const host_interfaces& h,
                                                 const std::vector<std::string>& wanted);

/// Chooses, per host, the interfaces over which it reached every other host, from each
/// host's probe results (`results[i]` are the probes host i ran). Interfaces are taken
/// in name order. Throws std::invalid_argument with a per-host account (interfaces and
/// what each probe found) when some host has none, or when a named interface
/// (`wanted`) that a host has does not work there.
std::vector<nic_choice> choose_interfaces(const std::vector<host_interfaces>& hosts,
                                          const std::vector<std::vector<probe_result>>& results,
                                          const std::vector<std::string>& wanted);

} // namespace cafhvd

namespace cafhvd {

/// Opens a TCP connection to every endpoint in parallel and closes it again; returns,
/// per endpoint, "" when it connected or why not ("connection refused", "no connection
/// within N s", ...). Used before CAF connects, whose connects run one at a time and
/// would let one unreachable host stall all others.
std::vector<std::string>
check_tcp_reachable(const std::vector<std::pair<std::string, uint16_t>>& endpoints,
                    std::chrono::milliseconds timeout);

} // namespace cafhvd
