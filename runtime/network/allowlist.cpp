// The job's client allowlist (see allowlist.hpp).
#include "runtime/network/allowlist.hpp"

#include <unistd.h>

#include <fmt/format.h>

namespace cafhvd {

bool address_allowlist::loopback(const std::string& address) const {
  return trust_loopback_
         && (address.rfind("127.", 0) == 0 || address == "::1"
             || address.rfind("::ffff:127.", 0) == 0);
}

address_allowlist::address_allowlist(bool trust_loopback)
    : trust_loopback_(trust_loopback), local_uids_{0, static_cast<uint32_t>(::geteuid())} {}

void address_allowlist::add_host(const std::string& name, const std::vector<std::string>& addresses,
                                 bool local, std::optional<uint32_t> rank_uid) {
  std::lock_guard g{m_};
  if (local)
    local_.insert(name);
  if (local && rank_uid)
    local_uids_.insert(*rank_uid);
  for (auto& a : addresses) {
    if (loopback(a))
      continue; // loopback speaks for the local hosts only (speaks_for)
    hosts_[name].insert(a);
    all_.insert(a);
  }
}

bool address_allowlist::allows(const std::string& address) const {
  if (loopback(address))
    return true;
  std::lock_guard g{m_};
  return all_.count(address) > 0;
}

std::string address_allowlist::refusal(const std::string& address, const peer_owner& owner) const {
  if (owner.local) {
    if (!owner.uid)
      return fmt::format("the owner of its socket on this machine is not known ({})",
                         owner.problem);
    std::lock_guard g{m_};
    if (!local_uids_.count(*owner.uid))
      return fmt::format("its socket on this machine is uid {}'s, not the driver's or an "
                         "account this job's ranks run as here",
                         *owner.uid);
  } else if (loopback(address)) {
    // A loopback client is always on this machine: not in its socket table, it is gone.
    return fmt::format("its socket was not found on this machine ({})",
                       owner.problem.empty() ? "it closed" : owner.problem);
  }
  if (!allows(address))
    return "not an address of this job's hosts";
  return {};
}

bool address_allowlist::speaks_for(const std::string& name, const std::string& address) const {
  std::lock_guard g{m_};
  if (loopback(address))
    return local_.count(name) > 0; // the driver's own machine: its own hosts only
  auto it = hosts_.find(name);
  return it != hosts_.end() && it->second.count(address) > 0;
}

address_allowlist::refusal_note address_allowlist::note_refusal(const std::string& server,
                                                                const std::string& what) {
  std::lock_guard g{m_};
  auto& seen = reported_[server];
  if (seen.size() >= max_reported || !seen.insert(what).second)
    return refusal_note::quiet;
  return seen.size() == max_reported ? refusal_note::last : refusal_note::show;
}

bool address_allowlist::first_refusal(const std::string& server, const std::string& what) {
  return note_refusal(server, what) != refusal_note::quiet;
}

} // namespace cafhvd
