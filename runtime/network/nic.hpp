// Network interfaces of this host, as NIC discovery needs them: up IPv4 interfaces with
// their addresses, in a deterministic order.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cafhvd {

struct interface_addr {
  std::string name;    // e.g. "lo", "eth0"
  std::string address; // dotted IPv4
  int prefix = 0;      // netmask length
  bool loopback = false;
  friend bool operator==(const interface_addr&, const interface_addr&) = default;
};

/// Up IPv4 interfaces with addresses, sorted by name then address.
std::vector<interface_addr> list_interfaces();

/// The local IPv4 address this host's routing table uses to reach `peer` (no packet is
/// sent: a UDP socket is connected and asked for its name).
std::optional<std::string> local_address_towards(const std::string& peer);

/// The first IPv4 address of `host` (a name or an address); nullopt with `error` set
/// (getaddrinfo's message) when it does not resolve.
std::optional<std::string> resolve_ipv4(const std::string& host, std::string* error = nullptr);

/// True for 127.0.0.0/8.
bool is_loopback_address(const std::string& ipv4);

} // namespace cafhvd
