// The job actor's choices per host: GPUs lent by each node, and the network interface
// (NIC discovery: loopback, the named interfaces, or probes between the hosts).
#include "actors/job/job_actor.hpp"

namespace cafhvd::driver_impl {

std::string job::gpu_shortage(const ehost& h, size_t need) {
  if (h.info.gpus.empty())
    return fmt::format("{} has no GPUs ({}; declare them with --gpus)", h.info.name,
                       h.info.gpu_source);
  return fmt::format("{} has {} free of {} (needs {} for {} slot{} x {})", h.info.name,
                     h.info.gpus_free.size(), h.info.gpus.size(), need, need / job_.gpus_per_slot,
                     need / job_.gpus_per_slot == 1 ? "" : "s", job_.gpus_per_slot);
}

// Static: every host must hold its ranks' devices before anything starts.
void job::lend_fixed_gpus() {
  std::vector<std::string> short_hosts;
  for (auto& ep : listed_order_) {
    auto& h = hosts_.at(ep);
    auto need = static_cast<size_t>(h.planned) * job_.gpus_per_slot;
    if (h.info.gpus_free.size() < need)
      short_hosts.push_back(gpu_shortage(h, need));
  }
  if (!short_hosts.empty())
    return fail(fmt::format("not enough GPUs for {} rank{} with {} GPU{} per slot: {}", job_.np,
                            job_.np == 1 ? "" : "s", job_.gpus_per_slot,
                            job_.gpus_per_slot == 1 ? "" : "s", fmt::join(short_hosts, "; ")));
  for (auto& ep : listed_order_) {
    auto& h = hosts_.at(ep);
    auto need = static_cast<uint32_t>(h.planned) * job_.gpus_per_slot;
    request(h.colocator, job_.start_timeout, gpu_atom::value, need)
        .then(
            [this, ep, need](gpu_lease& lease) {
              auto& h = hosts_.at(ep);
              if (lease.devices.size() < need)
                return fail(fmt::format("{} could not lend {} GPUs to the job: {}", h.label(), need,
                                        lease.why));
              h.gpus = std::move(lease.devices);
              log("{} lent GPUs [{}] to the job", h.label(), join_devices(h.gpus));
              for (auto& other : listed_order_)
                if (hosts_.at(other).gpus.size()
                    < static_cast<size_t>(hosts_.at(other).planned) * job_.gpus_per_slot)
                  return;
              phase("nic");
              choose_fixed_nics();
            },
            [this, ep](caf::error& e) {
              host_unusable(ep, fmt::format("no GPUs lent: {}", describe(e)));
            });
  }
}

// Elastic: a host offers as many slots as its free devices allow (at most its listed
// slots); it lends them when it joins and keeps them for the job.
void job::lend_elastic_gpus(const std::string& ep) {
  auto& h = hosts_.at(ep);
  int fit = std::min(h.slots(), static_cast<int>(h.info.gpus_free.size() / job_.gpus_per_slot));
  if (fit <= 0)
    return host_unusable(
        ep, fmt::format("no free GPU for this job: {}", gpu_shortage(h, job_.gpus_per_slot)));
  auto need = static_cast<uint32_t>(fit) * job_.gpus_per_slot;
  request(h.colocator, job_.start_timeout, gpu_atom::value, need)
      .then(
          [this, ep, need](gpu_lease& lease) {
            auto it = hosts_.find(ep);
            if (it == hosts_.end())
              return;
            auto& h = it->second;
            if (lease.devices.size() < need)
              return host_unusable(ep, fmt::format("no GPUs lent: {}", lease.why));
            h.gpus = std::move(lease.devices);
            h.gpu_cap = static_cast<int>(h.gpus.size() / job_.gpus_per_slot);
            log("{} lent GPUs [{}] to the job ({} slots)", h.label(), join_devices(h.gpus),
                h.gpu_cap);
            choose_nic(ep);
          },
          [this, ep](caf::error& e) {
            host_unusable(ep, fmt::format("no GPUs lent: {}", describe(e)));
          });
}

// The devices a rank sees: the job's devices on its node (shared; local rank i uses
// the i-th group of gpus_per_slot) or only its own (per-rank).
std::optional<std::string> job::visible_devices(const ehost& h, int local_rank) {
  if (job_.gpus_per_slot == 0)
    return std::nullopt;
  if (!job_.cuda_per_rank)
    return join_devices(h.gpus);
  auto g = static_cast<size_t>(job_.gpus_per_slot);
  auto first = static_cast<size_t>(local_rank) * g;
  if (first + g > h.gpus.size())
    return std::string{}; // cannot happen: placement is bounded by the devices
  return join_devices(std::vector<int32_t>(h.gpus.begin() + static_cast<long>(first),
                                           h.gpus.begin() + static_cast<long>(first + g)));
}

// Static jobs choose every host's interface at once, deterministically: all on this
// machine, one of them reached over loopback -> loopback; one host -> the named
// interfaces or the one the driver reached it through; otherwise every host probes every
// other host's candidate addresses from each of its candidate interfaces, and each keeps
// those that reached all others.
void job::choose_fixed_nics() {
  std::vector<ehost*> hs;
  for (auto& ep : listed_order_)
    hs.push_back(&hosts_.at(ep));
  // Agents reached at an address of this machine (a cluster's agents on one machine: the
  // table lists its own agent at the machine's address, members at the loopback address
  // they joined from) run here as the loopback ones do.
  std::set<std::string> mine;
  for (auto& i : list_interfaces())
    mine.insert(i.address);
  size_t loopback = 0, here = 0;
  for (auto* h : hs) {
    bool lo = job_.embedded || is_loopback_address(h->address);
    loopback += lo;
    here += lo || mine.count(h->address) > 0;
  }
  if (loopback != 0 && here != hs.size()) {
    std::vector<std::string> lo;
    for (auto* h : hs)
      if (is_loopback_address(h->address))
        lo.push_back(h->label());
    return fail(fmt::format("nodes {} were reached at a loopback address, which the job's "
                            "hosts on other machines cannot reach; name them by an address of "
                            "the shared network",
                            fmt::join(lo, ", ")));
  }
  if (loopback != 0) {
    for (auto* h : hs) {
      auto name = loopback_name(h->info);
      if (!job_.network_interfaces.empty()
          && std::find(job_.network_interfaces.begin(), job_.network_interfaces.end(), name)
                 == job_.network_interfaces.end())
        return fail(fmt::format("--network-interface: every node of this job is on this "
                                "machine and talks over {}, which is not among the named "
                                "interfaces",
                                name));
      h->nics = {name};
      h->reach_address = "127.0.0.1";
    }
    return fixed_hosts_ready();
  }
  if (hs.size() == 1) {
    auto& h = *hs.front();
    h.reach_address = h.address;
    h.nics.clear();
    if (!job_.network_interfaces.empty()) {
      try {
        for (auto& a :
             candidate_interfaces({h.info.name, h.info.interfaces}, job_.network_interfaces))
          if (std::find(h.nics.begin(), h.nics.end(), a.name) == h.nics.end()) {
            if (h.nics.empty())
              h.reach_address = a.address;
            h.nics.push_back(a.name);
          }
      } catch (const std::exception& e) {
        return fail(fmt::format("NIC discovery: {}", e.what()));
      }
      return fixed_hosts_ready();
    }
    for (auto& a : h.info.interfaces)
      if (a.address == h.address)
        h.nics = {a.name};
    if (h.nics.empty())
      h.nics = {loopback_name(h.info)};
    return fixed_hosts_ready();
  }
  std::vector<host_interfaces> ifs;
  std::vector<std::vector<interface_addr>> candidates;
  for (auto* h : hs) {
    ifs.push_back({h->info.name, h->info.interfaces});
    try {
      candidates.push_back(candidate_interfaces(ifs.back(), job_.network_interfaces));
    } catch (const std::exception& e) {
      return fail(fmt::format("NIC discovery: {}", e.what()));
    }
  }
  auto results = std::make_shared<std::vector<std::vector<probe_result>>>(hs.size());
  auto left = std::make_shared<size_t>(hs.size());
  for (size_t i = 0; i < hs.size(); ++i) {
    std::vector<probe_target> targets;
    for (size_t j = 0; j < hs.size(); ++j)
      if (j != i)
        for (auto& a : candidates[j])
          targets.push_back({hs[j]->info.name, a.address, hs[j]->info.probe_port});
    auto ep = listed_order_[i];
    request(hs[i]->colocator, job_.start_timeout, probe_atom::value, std::move(targets),
            job_.network_interfaces)
        .then(
            [this, i, ep, results, left, ifs](std::vector<probe_result>& r) {
              for (auto& pr : r)
                log("probe {} {} -> {} {}: {}", hosts_.at(ep).info.name, pr.iface, pr.host,
                    pr.address, pr.ok ? "ok" : pr.error);
              (*results)[i] = std::move(r);
              if (--*left > 0 || done_)
                return;
              try {
                for (auto& c : choose_interfaces(ifs, *results, job_.network_interfaces))
                  for (auto& e : listed_order_)
                    if (auto& h = hosts_.at(e); h.info.name == c.host) {
                      h.nics = c.usable;
                      h.reach_address = c.address;
                    }
              } catch (const std::exception& e) {
                return fail(e.what());
              }
              fixed_hosts_ready();
            },
            [this, ep](caf::error& e) {
              fail(fmt::format("NIC probes of {}: {}", hosts_.at(ep).label(), describe(e)));
            });
  }
}

void job::fixed_hosts_ready() {
  for (auto& ep : listed_order_) {
    auto& h = hosts_.at(ep);
    log("{} uses {} (usable: {}), reached at {}", h.label(), h.nics.front(), fmt::join(h.nics, ","),
        h.reach_address);
  }
  for (auto& ep : listed_order_)
    if (!done_)
      host_ready(ep);
}

// Loopback agents talk over loopback. Otherwise a joining host probes every ready
// host's candidate addresses from each of its candidate interfaces; it uses the
// interfaces that reach all of them (the first one for Gloo).
void job::choose_nic(const std::string& ep) {
  auto& h = hosts_.at(ep);
  if (is_loopback_address(h.address)) {
    h.nics = {loopback_name(h.info)};
    h.reach_address = "127.0.0.1";
    return host_ready(ep);
  }
  std::vector<interface_addr> mine;
  try {
    mine = candidate_interfaces(host_interfaces{h.info.name, h.info.interfaces},
                                job_.network_interfaces);
  } catch (const std::exception& e) {
    return host_unusable(ep, fmt::format("NIC discovery: {}", e.what()));
  }
  std::vector<probe_target> targets;
  std::set<std::string> peers;
  for (auto& [other, o] : hosts_) {
    if (other == ep || o.st != ehost::status::ready || is_loopback_address(o.address))
      continue;
    peers.insert(o.info.name);
    if (o.reach_address.empty())
      continue;
    targets.push_back({o.info.name, o.reach_address, o.info.probe_port});
  }
  if (targets.empty()) {
    // The first host: the interface the driver reached it through.
    for (auto& a : mine)
      if (a.address == h.address)
        h.nics = {a.name};
    if (h.nics.empty() && !mine.empty())
      h.nics = {mine.front().name};
    if (h.nics.empty())
      return host_unusable(ep, "NIC discovery: no candidate interface");
    h.reach_address = h.address;
    for (auto& a : mine)
      if (a.name == h.nics.front())
        h.reach_address = a.address;
    return host_ready(ep);
  }
  request(h.colocator, job_.start_timeout, probe_atom::value, targets, job_.network_interfaces)
      .then(
          [this, ep, peers, mine](std::vector<probe_result>& results) {
            auto& h = hosts_.at(ep);
            std::map<std::string, std::set<std::string>> reached; // iface -> peers
            for (auto& r : results) {
              log("probe {} {} -> {} {}: {}", h.info.name, r.iface, r.host, r.address,
                  r.ok ? "ok" : r.error);
              if (r.ok)
                reached[r.iface].insert(r.host);
            }
            h.nics.clear();
            for (auto& a : mine)
              if (reached[a.name].size() == peers.size()
                  && std::find(h.nics.begin(), h.nics.end(), a.name) == h.nics.end()) {
                h.nics.push_back(a.name);
                if (h.nics.size() == 1)
                  h.reach_address = a.address;
              }
            if (h.nics.empty())
              return host_unusable(
                  ep, fmt::format("NIC discovery: none of its interfaces reaches every host of "
                                  "the job ({})",
                                  fmt::join(peers, ", ")));
            host_ready(ep);
          },
          [this, ep](caf::error& e) {
            host_unusable(ep, fmt::format("NIC probes: {}", describe(e)));
          });
}

} // namespace cafhvd::driver_impl
