// Whose a local client is: the account that owns the client's end of a TCP connection
// this process accepted, read from the kernel's socket table. Horovod's HTTP client and
// torch's store client send no credential; where client and server share a machine, the
// table names the client's owner, which address rules cannot.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cafhvd {

struct peer_owner {
  bool local = false;          // the client's socket is in this network namespace
  std::optional<uint32_t> uid; // its owner, when local and the table could be read
  std::string problem;         // why the table could not be read ("" otherwise)
};

/// The owner of the client socket of connected socket `fd` (an accepted connection):
/// found by the exact address pair with the kernel's socket diagnostics (netlink
/// sock_diag), else in /proc/net/tcp and tcp6. A client on another machine, or in
/// another network namespace of this one, is not local. A client that closed before the
/// lookup is not found either: callers that admit only local clients of known accounts
/// therefore refuse it, which costs such a client nothing.
peer_owner owner_of_peer(int fd);

} // namespace cafhvd
