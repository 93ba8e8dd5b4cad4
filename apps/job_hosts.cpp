// Where a job's hosts come from: `caf-hvd run`'s local slots, an elastic driver's
// discovery script, or a static driver's allocation, -H or hostfile (with the address of
// every host that gets ranks).
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "apps/job_options.hpp"
#include "runtime/network/nic.hpp"

namespace cafhvd::cli {

namespace {

std::string resolve_or_fail(const std::string& host) {
  std::string error;
  auto a = resolve_ipv4(host, &error);
  if (!a)
    throw usage_error(fmt::format("cannot resolve host '{}': {}", host, error));
  return *a;
}

} // namespace

bool np_given(const po::variables_map& vm) {
  for (auto name : {"np", "num-proc", "nproc-per-node", "nproc_per_node"})
    if (vm.count(name))
      return true;
  return false;
}

elastic_config elastic_options(const job_options& o, const po::variables_map& vm,
                               bool from_cluster) {
  elastic_config ec;
  if (!o.hosts.empty() || !o.hostfile.empty())
    throw usage_error("--host-discovery-script replaces -H/--hostfile: list the hosts from the "
                      "script");
  ec.discovery_script = o.discovery_script;
  ec.shim = shim_path();
  // The cluster's table lists the hosts (from_cluster): no script to check.
  if (!from_cluster) {
    struct stat st {};
    if (::stat(ec.discovery_script.c_str(), &st) != 0)
      throw usage_error(
          fmt::format("--host-discovery-script {}: {}", ec.discovery_script, std::strerror(errno)));
    if (!S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0
        || ::access(ec.discovery_script.c_str(), X_OK) != 0)
      throw usage_error(fmt::format("--host-discovery-script {}: not an executable file (chmod +x "
                                    "it, and start it with #!/bin/sh or similar)",
                                    ec.discovery_script));
  }
  ec.min_np = vm.count("min-np") ? o.min_np : np_given(vm) ? o.np : 1;
  if (ec.min_np < 1)
    throw usage_error(fmt::format("--min-np {}: need at least 1 rank", ec.min_np));
  if (np_given(vm) && vm.count("min-np") && o.np < o.min_np)
    throw usage_error(fmt::format("-np {} is below --min-np {}", o.np, o.min_np));
  if (vm.count("max-np")) {
    if (o.max_np < ec.min_np)
      throw usage_error(
          fmt::format("--max-np {} is below the minimum of {} ranks", o.max_np, ec.min_np));
    ec.max_np = o.max_np;
  }
  if (vm.count("slots-per-host")) {
    if (o.slots_per_host < 1)
      throw usage_error(fmt::format("--slots-per-host {}: need at least 1", o.slots_per_host));
    ec.slots_per_host = static_cast<uint32_t>(o.slots_per_host);
  }
  double timeout = o.elastic_timeout;
  if (!vm.count("elastic-timeout"))
    if (const char* env = std::getenv("HOROVOD_ELASTIC_TIMEOUT"); env && *env) {
      try {
        timeout = std::stod(env);
      } catch (const std::exception&) {
        throw usage_error(fmt::format("HOROVOD_ELASTIC_TIMEOUT='{}' is not a number", env));
      }
    }
  if (!(timeout > 0))
    throw usage_error("--elastic-timeout must be a positive number of seconds");
  ec.elastic_timeout = std::chrono::milliseconds(static_cast<long>(timeout * 1000));
  if (vm.count("reset-limit")) {
    if (o.reset_limit < 0)
      throw usage_error(fmt::format("--reset-limit {} must not be negative", o.reset_limit));
    ec.reset_limit = o.reset_limit;
  }
  ec.warm_joins = vm.count("cold-joins") == 0;
  if (vm.count("blacklist-cooldown-range")) {
    if (o.cooldown.size() != 2)
      throw usage_error("--blacklist-cooldown-range takes two numbers: LOW HIGH (seconds)");
    auto lo = o.cooldown[0], hi = o.cooldown[1];
    if (!(lo >= 1) || !(hi <= 3600) || !(lo <= hi))
      throw usage_error(fmt::format("--blacklist-cooldown-range {} {}: need 1 <= LOW <= HIGH <= "
                                    "3600",
                                    lo, hi));
    ec.cooldown = cooldown_range{lo, hi};
  }
  if (!(o.discovery_interval >= 0.01) || o.discovery_interval > 3600)
    throw usage_error("--discovery-interval must be between 0.01 and 3600 seconds");
  ec.discovery_interval = std::chrono::milliseconds(static_cast<long>(o.discovery_interval * 1000));
  return ec;
}

int local_slots(const job_options& o, std::optional<int> np) {
  std::vector<host_spec> hs;
  try {
    if (!o.hosts.empty() && !o.hostfile.empty())
      throw usage_error("give -H or --hostfile, not both");
    if (!o.hosts.empty()) {
      hs = parse_host_list(o.hosts);
    } else {
      std::ifstream in{o.hostfile};
      if (!in)
        throw usage_error(fmt::format("cannot open hostfile {}", o.hostfile));
      hs = parse_hostfile(in, o.hostfile);
    }
  } catch (const spec_error& e) {
    throw usage_error(e.what());
  }
  long total = 0;
  for (auto& h : hs) {
    std::string error;
    auto addr = h.host == this_hostname() ? std::optional<std::string>{"127.0.0.1"}
                                          : resolve_ipv4(h.host, &error);
    if (!addr || !is_loopback_address(*addr))
      throw usage_error(fmt::format("caf-hvd run runs on this machine only, and '{}' is not "
                                    "this machine; run the job with caf-hvd driver and a "
                                    "node agent on each host",
                                    h.host));
    total += h.slots;
  }
  if (np && *np > total)
    throw usage_error(fmt::format("-np {} exceeds the {} slots given", *np, total));
  return np ? *np : static_cast<int>(total);
}

void static_hosts(job_options& o, const po::variables_map& vm,
                  const std::optional<allocation>& alloc, job_config& job) {
  if (!o.hosts.empty() && !o.hostfile.empty())
    throw usage_error("give the hosts with exactly one of -H/--hosts or --hostfile");
  if (o.hosts.empty() && o.hostfile.empty() && !alloc)
    throw usage_error("give the hosts with -H/--hosts or --hostfile, or a cluster to place the "
                      "ranks on with --cluster HOST[:PORT] or CAF_HVD_CLUSTER (or run inside a "
                      "Slurm, PBS or LSF allocation)");
  try {
    if (alloc) {
      job.hosts = alloc->hosts;
      if (!np_given(vm)) {
        o.np = 0;
        for (auto& h : job.hosts)
          o.np += static_cast<int>(h.slots);
      }
      std::cerr << fmt::format("caf-hvd: {} hosts from {} ({} slots)\n", job.hosts.size(),
                               alloc->source, o.np);
    } else if (!o.hosts.empty()) {
      job.hosts = parse_host_list(o.hosts);
    } else {
      std::ifstream in{o.hostfile};
      if (!in)
        throw usage_error(fmt::format("cannot open hostfile {}", o.hostfile));
      job.hosts = parse_hostfile(in, o.hostfile);
    }
  } catch (const spec_error& e) {
    throw usage_error(e.what());
  }
  long total = 0;
  for (auto& h : job.hosts)
    total += h.slots;
  if (o.np > total)
    throw usage_error(fmt::format("-np {} exceeds the {} slots of the given hosts", o.np, total));
  // Only hosts that receive ranks are contacted (the first hosts' slots in order).
  long need = o.np;
  auto node_addresses =
      o.launcher == "slurm" ? slurm_node_addresses() : std::map<std::string, std::string>{};
  for (auto& h : job.hosts) {
    if (need <= 0)
      break;
    auto known = node_addresses.find(h.host);
    job.addresses.push_back(
        resolve_or_fail(known != node_addresses.end() ? known->second : h.host));
    need -= h.slots;
  }
}

} // namespace cafhvd::cli
