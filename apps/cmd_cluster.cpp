// caf-hvd cluster: a cluster's credentials (init, add-node, add-driver, revoke), through
// runtime/cluster/credential_files.
#include <iostream>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/cli.hpp"
#include "runtime/cluster/credential_files.hpp"
#include "runtime/network/net.hpp"

namespace cafhvd::cli {

namespace {

constexpr const char* cluster_usage =
    "usage:\n"
    "  caf-hvd cluster init [DIR]                        a new CA, a node and a driver "
    "certificate\n"
    "  caf-hvd cluster add-node NAME [DIR] [--out OUT]   a node agent's credentials\n"
    "  caf-hvd cluster add-driver NAME [DIR] [--out OUT] a driver's credentials\n"
    "  caf-hvd cluster add-admin NAME [DIR] [--out OUT]  an administrator's (drain, undrain, cancel)\n"
    "  caf-hvd cluster revoke NAME|CERT.pem [DIR]        revoke NAME's certificates (crl.pem)\n"
    "DIR: the cluster's directory (default $CAF_HVD_CLUSTER_DIR, else "
    "~/.config/caf-hvd/cluster); OUT: default DIR/issued/NAME";

} // namespace

int run_cluster(int argc, char** argv) {
  std::vector<std::string> args(argv + 2, argv + argc);
  std::string out;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i] == "--out") {
      if (i + 1 == args.size())
        throw usage_error(std::string{"--out needs a directory\n"} + cluster_usage);
      out = args[i + 1];
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
      --i;
    } else if (args[i] == "--help" || args[i] == "-h") {
      std::cout << cluster_usage << "\n";
      return 0;
    }
  if (args.empty())
    throw usage_error(cluster_usage);
  auto verb = args[0];
  bool named =
      verb == "add-node" || verb == "add-driver" || verb == "add-admin" || verb == "revoke";
  if ((verb != "init" && !named) || (named && args.size() < 2) || args.size() > (named ? 3u : 2u)
      || (!out.empty() && (verb == "init" || verb == "revoke")))
    throw usage_error(cluster_usage);
  auto dir_arg =
      args.size() > (named ? 2u : 1u) ? std::optional<std::string>{args.back()} : std::nullopt;
  auto dir = cluster_dir(dir_arg);
  try {
    auto& net = net::module();
    if (verb == "init") {
      net.init_cluster(dir);
      std::cout << fmt::format(
          "created the cluster's credentials in {}:\n"
          "  ca.pem, ca.key          the cluster's CA (keep ca.key on this machine only)\n"
          "  node.pem, node.key      a node agent's certificate (role node: accepts drivers)\n"
          "  driver.pem, driver.key  a driver's certificate (role driver: drives node agents)\n"
          "  admin.pem, admin.key    an administrator's certificate (drains nodes, cancels jobs)\n"
          "On a trusted single machine, use {} as it is. For a cluster, give each host its own "
          "directory with 'caf-hvd cluster add-node HOST' and each head node one with "
          "'caf-hvd cluster add-driver NAME', and pass it with --cluster-dir or "
          "CAF_HVD_CLUSTER_DIR.\n",
          dir, dir);
    } else if (verb == "revoke") {
      auto serials = net.revoke_credentials(dir, args[1]);
      std::cout << fmt::format(
          "revoked {} certificate(s) named '{}' (serial {}); {}/crl.pem now lists them.\n"
          "Copy crl.pem into the cluster directory of every host and head node, then send "
          "SIGHUP to running node agents (drivers read it when they start).\n",
          serials.size(), args[1], fmt::join(serials, ", "), dir);
    } else {
      auto role = verb == "add-node"    ? cert_role::node
                  : verb == "add-admin" ? cert_role::admin
                                        : cert_role::driver;
      auto target = net.issue_credentials(dir, role, args[1], out);
      std::cout << fmt::format(
          "issued a {} certificate for '{}' in {} (ca.pem, {}.pem, {}.key{}).\n"
          "Copy that directory to the {} and pass it with --cluster-dir or "
          "CAF_HVD_CLUSTER_DIR.\n",
          to_string(role), args[1], target, to_string(role), to_string(role),
          ::access((target + "/crl.pem").c_str(), F_OK) == 0 ? ", crl.pem" : "",
          role == cert_role::node    ? "host"
          : role == cert_role::admin ? "administrator's machine"
                                     : "head node");
    }
  } catch (const credentials_error& e) {
    throw std::runtime_error(e.what());
  }
  return 0;
}

} // namespace cafhvd::cli
