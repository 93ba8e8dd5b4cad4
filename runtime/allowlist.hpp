// Which clients a job's servers (rendezvous, torch store) serve: the addresses of the
// job's hosts (every address their agents reported) and loopback on the driver's host.
// Thread-safe: the job adds hosts, the servers' threads ask.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace cafhvd {

class address_allowlist {
public:
  explicit address_allowlist(bool trust_loopback = true) : trust_loopback_(trust_loopback) {}
  /// Host `name` (HOROVOD_HOSTNAME) reaches the servers from any of `addresses`.
  void add_host(const std::string& name, const std::vector<std::string>& addresses);
  /// Whether a client at `address` may connect at all.
  bool allows(const std::string& address) const;
  /// Whether a client at `address` may speak for host `name` (vote for its slots).
  bool speaks_for(const std::string& name, const std::string& address) const;
  /// True the first time `address` is refused by `server` (so each is reported once).
  bool first_refusal(const std::string& server, const std::string& address);

private:
  bool loopback(const std::string& address) const;
  bool trust_loopback_;
  mutable std::mutex m_;
  std::map<std::string, std::set<std::string>> hosts_;
  std::set<std::string> all_;
  std::set<std::pair<std::string, std::string>> reported_;
};

} // namespace cafhvd
