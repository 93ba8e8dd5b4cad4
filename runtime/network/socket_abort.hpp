// Ends the Gloo connections of a rank's processes from outside (the launcher's
// ncclCommAbort): finds their TCP connections in /proc, takes a copy of each Gloo socket
// with pidfd_getfd and shuts it down. Linux only (pidfd_getfd: 5.6); no actors here.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

namespace cafhvd {

/// An IPv4 or IPv6 address with a port; IPv4 is kept as an IPv4-mapped IPv6 address, so
/// 10.0.0.1:80 in /proc/net/tcp and ::ffff:10.0.0.1:80 in /proc/net/tcp6 are equal.
struct tcp_endpoint {
  std::array<uint8_t, 16> address{};
  uint16_t port = 0;
  auto operator<=>(const tcp_endpoint&) const = default;
  bool wildcard() const; // 0.0.0.0 or ::
  /// "10.0.0.1:80", "[fe80::1]:80"
  std::string str() const;
};

/// Parses what str() writes; nullopt for anything else.
std::optional<tcp_endpoint> parse_endpoint(std::string_view text);

/// The listening addresses in a value a Gloo rank wrote to the rendezvous store under
/// its rank number (connectFullMesh): one gloo::transport::tcp::Address per peer, each a
/// sockaddr_storage and a sequence number, on 64-bit Linux 136 bytes. Empty when the
/// value is not such a list (another key's value, or a layout this code does not know).
std::vector<tcp_endpoint> gloo_addresses(std::string_view value);

/// One TCP socket of a process.
struct tcp_connection {
  pid_t pid = 0;
  int fd = -1;
  tcp_endpoint local, remote;
  int state = 0;      // the kernel's TCP state (1: ESTABLISHED, 10: LISTEN)
  uint64_t inode = 0; // the socket's inode (the descriptor may be reused meanwhile)
};

/// The rows of /proc/<pid>/net/tcp or tcp6 (`text`): socket inode -> (local, remote,
/// state, owner).
struct tcp_row {
  uint64_t inode = 0; // 0: no process holds the socket any more (closed, TIME_WAIT)
  tcp_endpoint local, remote;
  int state = 0;
  uint32_t uid = 0; // the socket's owner
};
std::vector<tcp_row> parse_tcp_table(std::string_view text, bool v6);

/// The TCP sockets of a process (its descriptors, matched against its network namespace's
/// tables). Empty when the process is gone; when its descriptors cannot be listed (a
/// process of another account, without root or CAP_DAC_READ_SEARCH), empty with the
/// reason in `problem`.
std::vector<tcp_connection> tcp_connections_of(pid_t pid, std::string* problem = nullptr);

/// The processes of a process group (a rank is its caf-hvd-exec shim's group).
std::vector<pid_t> process_group_members(pid_t pgid);

/// The selection rule: an ESTABLISHED connection is a Gloo connection of the job when one
/// of its endpoints is a listening address some rank of the job published for a Gloo
/// pair (`gloo`), and neither endpoint is one of the job's own servers (`keep`: the
/// rendezvous server, the torch store; a wildcard address there stands for every address).
bool is_gloo_connection(const tcp_connection& c, const std::set<tcp_endpoint>& gloo,
                        const std::set<tcp_endpoint>& keep);

/// What an abort did on one host.
struct socket_abort_result {
  uint32_t cut = 0;                  // connections shut down
  std::vector<std::string> problems; // per process or socket, with the OS error
  bool refused = false; // pidfd_open/pidfd_getfd not allowed or not available (EPERM, ENOSYS)
};

/// What became of one socket.
struct socket_shutdown {
  bool cut = false;     // shut down
  bool refused = false; // pidfd_open/pidfd_getfd not allowed or not available
  std::string problem;  // the failed call and its error ("" when cut or already gone)
};

/// Shuts down (SHUT_RDWR) socket `fd` of process `pid` through a copy taken with
/// pidfd_getfd, if it still is socket `inode` (0: any); the process keeps its descriptor,
/// the connection ends (its peer reads EOF). A socket the process closed meanwhile, or a
/// descriptor that now names another file, is left alone without a problem.
socket_shutdown shutdown_socket_of(pid_t pid, int fd, uint64_t inode);

/// Every Gloo connection (is_gloo_connection) of every process in these process groups.
socket_abort_result abort_gloo_connections(const std::vector<pid_t>& pgids,
                                           const std::set<tcp_endpoint>& gloo,
                                           const std::set<tcp_endpoint>& keep);

} // namespace cafhvd
