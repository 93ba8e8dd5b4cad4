// caf-hvd: `node` runs a node agent, `driver` runs a job across node agents, `run` runs a
// whole job on this machine. This file holds the usage text and picks the subcommand;
// each subcommand has its own file (cmd_*.cpp, see cli.hpp).
#include <iostream>
#include <string_view>

#include <fmt/format.h>

#include "apps/cli.hpp"
#include "runtime/launch/process.hpp"

using namespace cafhvd;
using namespace cafhvd::cli;

namespace {

using cafhvd::cli::caf_hvd_version;

void print_usage(std::ostream& os) {
  os << "caf-hvd " << caf_hvd_version << ": a distributed training job launcher (Horovod-compatible)\n\n"
     << "usage:\n"
     << "  caf-hvd run -np N [options] -- COMMAND [ARGS...]     a job on this machine\n"
     << "  caf-hvd driver -np N -H HOST:SLOTS,... [options] -- COMMAND [ARGS...]\n"
     << "  caf-hvd driver --host-discovery-script PATH --min-np N [options] -- COMMAND\n"
     << "  caf-hvd node [--port PORT] [--name NAME] [--slots N] [--join HOST[:PORT]]\n"
     << "  caf-hvd status [--cluster HOST[:PORT]] [--json]     the cluster's nodes and jobs\n"
     << "  caf-hvd jobs [--cluster HOST[:PORT]] [--json]       the cluster's jobs\n"
     << "  caf-hvd drain|undrain NODE [--cluster HOST[:PORT]]  take a node out of placement\n"
     << "  caf-hvd cancel JOB [--cluster HOST[:PORT]] [--admin]  stop a running job's ranks\n"
     << "  caf-hvd cluster init|add-node|add-driver|add-admin|revoke ...\n"
     << "                                                      a cluster's credentials\n"
     << "  caf-hvd timeline EVENTS -o OUT.html|OUT.json        draw a job's event log\n"
     << "  caf-hvd hosts [-H SPEC | --hostfile FILE]           the hosts a job would use\n"
     << "  caf-hvd --version\n\n"
     << "Run 'caf-hvd SUBCOMMAND --help' for the options of each.\n";
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(std::cerr);
    return 2;
  }
  std::string_view sub = argv[1];
  try {
    if (sub == "--version" || sub == "version") {
      std::cout << "caf-hvd " << caf_hvd_version << " (CAF 0.17.6)\n";
      return 0;
    }
    if (sub == "--help" || sub == "-h" || sub == "help") {
      print_usage(std::cout);
      return 0;
    }
    if (sub == "node" || sub == "driver" || sub == "run")
      raise_descriptor_limit(); // connections per rank add up; ranks get the old limit back
    if (sub == "node")
      return run_node(argc, argv);
    if (sub == "driver")
      return run_job(argc, argv, false);
    if (sub == "run")
      return run_job(argc, argv, true);
    if (sub == "cluster")
      return run_cluster(argc, argv);
    if (sub == "timeline")
      return run_timeline(argc, argv);
    if (sub == "hosts")
      return run_hosts(argc, argv);
    if (sub == "status" || sub == "jobs")
      return run_status(argc, argv, sub == "jobs");
    if (sub == "drain" || sub == "undrain")
      return run_drain(argc, argv, sub == "drain");
    if (sub == "cancel")
      return run_cancel(argc, argv);
    std::cerr << fmt::format("caf-hvd: unknown subcommand '{}'\n\n", sub);
    print_usage(std::cerr);
    return 2;
  } catch (const usage_error& e) {
    std::cerr << fmt::format("caf-hvd {}: error: {}\n(see 'caf-hvd {} --help')\n", sub, e.what(),
                             sub);
    return 2;
  } catch (const std::exception& e) {
    std::cerr << fmt::format("caf-hvd {}: error: {}\n", sub, e.what());
    return 1;
  }
}
