// caf-hvd hosts: the hosts a job would use (-H, a hostfile, the batch allocation this runs
// in, $CAF_HVD_HOSTS, $CAF_HVD_HOSTFILE), one HOST:SLOTS line each, or that a cluster's
// table places the job.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/cli.hpp"
#include "runtime/job/allocation.hpp"
#include "runtime/job/host_spec.hpp"

namespace cafhvd::cli {

int run_hosts(int argc, char** argv) {
  po::options_description desc{"caf-hvd hosts: print the hosts a job would use, one HOST:SLOTS "
                               "line each (HOST:PORT:SLOTS when the port is not the default).\n\n"
                               "usage: caf-hvd hosts [-H SPEC,... | --hostfile FILE]\n"
                               "  without either: the allocation this runs in (Slurm, PBS, "
                               "LSF)\n\noptions"};
  std::string hosts, hostfile, cluster;
  desc.add_options()("help,h", "show this help")("hosts,H", po::value(&hosts),
                                                 "HOST:SLOTS or HOST:PORT:SLOTS, comma-separated")(
      "hostfile", po::value(&hostfile), "file of 'HOST[:PORT] slots=N' lines")(
      "cluster", po::value(&cluster),
      "HOST[:PORT]: a cluster whose table places the ranks (default: $CAF_HVD_CLUSTER, else "
      "the installed agent's /etc/default/caf-hvd-node)");
  if (!parse_options_only(argc, argv, desc, "hosts"))
    return 0; // --help
  if (!hosts.empty() && !hostfile.empty())
    throw usage_error("give the hosts with exactly one of -H/--hosts or --hostfile");
  std::vector<host_spec> list;
  std::string source;
  try {
    if (!hosts.empty()) {
      list = parse_host_list(hosts);
      source = "-H";
    } else if (!hostfile.empty()) {
      std::ifstream in{hostfile};
      if (!in)
        throw usage_error(fmt::format("cannot open hostfile {}", hostfile));
      list = parse_hostfile(in, hostfile);
      source = "hostfile " + hostfile;
    } else if (auto a = detect_allocation()) {
      list = a->hosts;
      source = a->source;
    } else if (const char* env = std::getenv("CAF_HVD_HOSTS"); env && *env) {
      list = parse_host_list(env);
      source = "$CAF_HVD_HOSTS";
    } else if (const char* file = std::getenv("CAF_HVD_HOSTFILE"); file && *file) {
      std::ifstream in{file};
      if (!in)
        throw usage_error(fmt::format("cannot open $CAF_HVD_HOSTFILE {}", file));
      list = parse_hostfile(in, file);
      source = fmt::format("$CAF_HVD_HOSTFILE {}", file);
    } else {
      auto choice = default_cluster(cluster);
      auto where = choice.address;
      if (where.empty())
        throw usage_error("no hosts: give -H or --hostfile, run inside a Slurm, PBS or LSF "
                          "allocation, or name a cluster (--cluster HOST[:PORT] or "
                          "CAF_HVD_CLUSTER)");
      std::cerr << fmt::format("caf-hvd: the hosts come from the cluster at {} ({}): its table "
                               "places a job's ranks on free slots when the job starts; "
                               "'caf-hvd status' lists its nodes\n",
                               where, choice.source);
      return 0;
    }
  } catch (const spec_error& e) {
    throw usage_error(e.what());
  }
  uint64_t total = 0;
  for (auto& h : list) {
    total += h.slots;
    if (h.port == default_node_port)
      std::cout << fmt::format("{}:{}\n", h.host, h.slots);
    else
      std::cout << fmt::format("{}:{}:{}\n", h.host, h.port, h.slots);
  }
  std::cerr << fmt::format("caf-hvd: {} hosts, {} slots, from {}\n", list.size(), total, source);
  return 0;
}

} // namespace cafhvd::cli
