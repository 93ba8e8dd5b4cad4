// The job's client allowlist (see allowlist.hpp).
#include "runtime/allowlist.hpp"

namespace cafhvd {

bool address_allowlist::loopback(const std::string& address) const {
  return trust_loopback_
         && (address.rfind("127.", 0) == 0 || address == "::1"
             || address.rfind("::ffff:127.", 0) == 0);
}

void address_allowlist::add_host(const std::string& name, const std::vector<std::string>& addresses,
                                 bool local) {
  std::lock_guard g{m_};
  if (local)
    local_.insert(name);
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
