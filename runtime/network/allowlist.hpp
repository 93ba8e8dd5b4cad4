// Which clients a job's servers (rendezvous, torch store) serve: the addresses of the
// job's hosts (every address their agents reported) and loopback on the driver's host.
// Loopback is the driver's own machine, not a wildcard: it speaks only for the hosts whose
// agents run there. Thread-safe: the job adds hosts, the servers' threads ask.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/network/peer_uid.hpp"

namespace cafhvd {

class address_allowlist {
public:
  /// `trust_loopback` false: loopback addresses are ordinary addresses (tests use them to
  /// play remote clients).
  explicit address_allowlist(bool trust_loopback = true);
  /// Host `name` (HOROVOD_HOSTNAME) reaches the servers from any of `addresses`. `local`:
  /// its agent runs on the driver's machine, so loopback clients speak for it. A remote
  /// host's loopback addresses are its own, never a client here: they are dropped.
  /// `rank_uid`: the account its ranks run as (node_info::rank_uid); for a local host,
  /// clients on this machine of that account are admitted (admits).
  void add_host(const std::string& name, const std::vector<std::string>& addresses,
                bool local = false, std::optional<uint32_t> rank_uid = std::nullopt);
  /// Whether a client at `address` may connect at all.
  bool allows(const std::string& address) const;
  /// Whether a client at `address`, whose socket is `owner` (owner_of_peer), may
  /// connect: allows(address) and, for a client on this machine, its socket owned by
  /// the driver's account, root, or an account the ranks of a host on this machine run
  /// as. "" when it may, else why not (for the refusal's report).
  std::string refusal(const std::string& address, const peer_owner& owner) const;
  /// Whether a client at `address` may speak for host `name` (vote for its slots, write
  /// its ranks' keys, register its notification services).
  bool speaks_for(const std::string& name, const std::string& address) const;
  /// Whether to report that `server` refused `what`: each once, and at most
  /// `max_reported` of each server (a client that varies what it sends grows neither the
  /// set nor the operator's terminal without bound); `last` is the final one shown, whose
  /// report should say that further refusals are counted only.
  enum class refusal_note { show, last, quiet };
  refusal_note note_refusal(const std::string& server, const std::string& what);
  /// note_refusal(...) != quiet.
  bool first_refusal(const std::string& server, const std::string& what);
  static constexpr size_t max_reported = 1024;

private:
  bool loopback(const std::string& address) const;
  bool trust_loopback_;
  mutable std::mutex m_;
  std::map<std::string, std::set<std::string>> hosts_;
  std::set<std::string> all_;
  std::set<std::string> local_;   // hosts on the driver's machine
  std::set<uint32_t> local_uids_; // accounts of their ranks, the driver's own, root
  std::map<std::string, std::set<std::string>> reported_; // by server
};

} // namespace cafhvd
