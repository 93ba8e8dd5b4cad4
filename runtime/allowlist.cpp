// The job's client allowlist (see allowlist.hpp).
#include "runtime/allowlist.hpp"

namespace cafhvd {

bool address_allowlist::loopback(const std::string& address) const {
  return trust_loopback_ && (address.rfind("127.", 0) == 0 || address == "::1"
                             || address.rfind("::ffff:127.", 0) == 0);
}

void address_allowlist::add_host(const std::string& name,
                                 const std::vector<std::string>& addresses) {
  std::lock_guard g{m_};
  for (auto& a : addresses) {
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
  if (loopback(address))
    return true; // the driver's own host
  std::lock_guard g{m_};
  auto it = hosts_.find(name);
  return it != hosts_.end() && it->second.count(address) > 0;
}

bool address_allowlist::first_refusal(const std::string& server, const std::string& address) {
  std::lock_guard g{m_};
  return reported_.emplace(server, address).second;
}

} // namespace cafhvd
