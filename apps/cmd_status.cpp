// caf-hvd status: the cluster at a glance, from the table its agents joined (nodes, their
// slots, GPUs, labels and states; the jobs running and where).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <variant>

#include <fmt/format.h>

#include "actors/config.hpp"
#include "actors/driver_util.hpp"
#include "actors/protocol.hpp"
#include "apps/cli.hpp"
#include "runtime/job/host_spec.hpp"
#include "runtime/cluster/membership.hpp"
#include "runtime/network/net.hpp"
#include "runtime/observe/text.hpp"

namespace cafhvd::cli {

namespace {

long unix_s() {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
}

// The table actor at `where` and its node, or an error message.
std::variant<std::pair<cluster_actor, caf::node_id>, std::string>
table_at(caf::actor_system& sys, caf::scoped_actor& self, const cluster_address& where,
         bool tls, std::chrono::milliseconds timeout) {
  auto peer = fmt::format("{}:{}", where.host, where.port);
  std::variant<std::pair<cluster_actor, caf::node_id>, std::string> out{std::string{}};
  self->request(net::module().connector(sys, tls), timeout, caf::connect_atom::value, where.host,
                where.port)
      .receive(
          [&](caf::node_id& nid, caf::strong_actor_ptr& published, std::set<std::string>&) {
            auto table = caf::actor_cast<cluster_actor>(published);
            if (table)
              out = std::make_pair(table, nid);
            else
              out = fmt::format("{} is a caf-hvd node agent without a cluster table (an older "
                                "version?)",
                                peer);
          },
          [&](caf::error& e) {
            out = fmt::format("cannot reach the cluster at {}: {}", peer,
                              connect_error(sys, e, tls, peer));
          });
  return out;
}

// The table at `where`, or an error message.
std::variant<cluster_view, std::string> fetch(caf::actor_system& sys, const cluster_address& where,
                                              const std::optional<cluster_credentials>& creds,
                                              std::chrono::milliseconds timeout) {
  caf::scoped_actor self{sys};
  auto got = table_at(sys, self, where, creds.has_value(), timeout);
  auto* t = std::get_if<std::pair<cluster_actor, caf::node_id>>(&got);
  if (!t)
    return std::get<std::string>(got);
  signed_ticket ticket;
  if (creds)
    ticket = net::module().sign_ticket(
        *creds, ticket_body("status", to_string(t->second), "status", unix_s()));
  std::variant<cluster_view, std::string> out{std::string{}};
  self->request(t->first, timeout, table_atom::value, ticket)
      .receive([&](cluster_view& v) { out = std::move(v); },
               [&](caf::error& e) {
                 out = fmt::format("{}:{} did not give its table: {}", where.host, where.port,
                                   sys.render(e));
               });
  return out;
}

// --cluster, else $CAF_HVD_CLUSTER, else the installed agent's (default_cluster), as an
// address; a usage error when none is there.
cluster_address cluster_option(const std::string& given, const char* hint) {
  auto where = default_cluster(given);
  if (where.address.empty())
    throw usage_error(
        fmt::format("give the cluster with --cluster HOST[:PORT]{} or set CAF_HVD_CLUSTER", hint));
  try {
    return parse_cluster_address(where.address, default_node_port);
  } catch (const std::exception& e) {
    throw usage_error(
        fmt::format("{} '{}': {}", where.source, printable(where.address), e.what()));
  }
}

// A subcommand's options with one operand (the option `name`, also given bare); nullopt
// after printing --help.
std::optional<po::variables_map> parse_with_operand(int argc, char** argv,
                                                    const po::options_description& desc,
                                                    const char* name) {
  po::positional_options_description pos;
  pos.add(name, 1);
  std::vector<std::string> args(argv + 2, argv + argc);
  auto vm = parse(args, desc, &pos);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return std::nullopt;
  }
  return vm;
}

} // namespace

int run_drain(int argc, char** argv, bool drain) {
  std::string verb = drain ? "drain" : "undrain";
  po::options_description desc{fmt::format(
      "caf-hvd {}: {} (an administrator's certificate: 'caf-hvd cluster add-admin').\n\n"
      "usage: caf-hvd {} NODE [--cluster HOST[:PORT]] [--cluster-dir DIR]\n\noptions",
      verb,
      drain ? "take a node out of placement; elastic jobs leave it at their next commit, its "
              "other ranks run on, and it takes no new jobs until undrained"
            : "return a drained node to placement",
      verb)};
  std::string cluster, where, node;
  desc.add_options()("help,h", "show this help")(
      "cluster", po::value(&where),
      "HOST[:PORT]: the agent that holds the cluster's table; default: $CAF_HVD_CLUSTER, else "
      "the installed agent's /etc/default/caf-hvd-node")(
      "cluster-dir", po::value(&cluster), "the cluster's credentials (an admin certificate)")(
      "insecure", "talk to agents started with --insecure")("node", po::value(&node),
                                                            "the node's name (as status shows it)");
  auto parsed = parse_with_operand(argc, argv, desc, "node");
  if (!parsed)
    return 0;
  auto& vm = *parsed;
  if (node.empty())
    throw usage_error(fmt::format("give the node to {}: caf-hvd {} NODE", verb, verb));
  if (!valid_host_name(node))
    throw usage_error(fmt::format("'{}' is not a node name", printable(node)));
  auto address = cluster_option(where, "");
  auto creds = credentials_for({vm.count("insecure") > 0, vm.count("cluster-dir") > 0, cluster},
                               cert_role::admin);
  hvd_config cfg;
  cfg.enable_network(liveness{}, creds ? &*creds : nullptr);
  int rc = 0;
  {
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    auto got = table_at(sys, self, address, creds.has_value(), std::chrono::seconds(10));
    std::string error;
    if (auto* t = std::get_if<std::pair<cluster_actor, caf::node_id>>(&got)) {
      signed_ticket ticket;
      if (creds)
        ticket = net::module().sign_ticket(
            *creds, ticket_body(drain ? "drain" : "undrain", to_string(t->second), node,
                                unix_s()));
      self->request(t->first, std::chrono::seconds(10), drain_atom::value, node, drain, ticket)
          .receive([&](std::string& why) { error = why; },
                   [&](caf::error& e) { error = sys.render(e); });
    } else {
      error = std::get<std::string>(got);
    }
    if (error.empty()) {
      std::cout << fmt::format("{} '{}'{}\n", drain ? "drained" : "undrained", node,
                               drain ? ": no new ranks there; elastic jobs leave it at their next "
                                       "commit ('caf-hvd status' shows when its ranks are gone)"
                                     : ": back in placement");
    } else {
      std::cerr << fmt::format("caf-hvd {}: error: {}\n", verb, error);
      rc = 1;
    }
    exit_watchdog(rc);
  }
  return rc;
}

int run_cancel(int argc, char** argv) {
  po::options_description desc{
      "caf-hvd cancel: stop a running job: every node that runs it sends its ranks SIGTERM, "
      "and SIGKILL after the job's grace period, and its driver ends saying who cancelled "
      "it. The job's owner (its driver certificate) or an administrator (--admin) may.\n\n"
      "usage: caf-hvd cancel JOB [--cluster HOST[:PORT]] [--cluster-dir DIR] [--admin]\n\n"
      "options"};
  std::string cluster, where, job;
  desc.add_options()("help,h", "show this help")(
      "cluster", po::value(&where),
      "HOST[:PORT]: the agent that holds the cluster's table; default: $CAF_HVD_CLUSTER, else "
      "the installed agent's /etc/default/caf-hvd-node")(
      "cluster-dir", po::value(&cluster),
      "the cluster's credentials (the job's driver certificate, or with --admin an "
      "administrator's)")("admin", "cancel as the cluster's administrator (admin.pem)")(
      "insecure", "talk to agents started with --insecure")(
      "job", po::value(&job), "the job's id (as 'caf-hvd status' lists it)");
  auto parsed = parse_with_operand(argc, argv, desc, "job");
  if (!parsed)
    return 0;
  auto& vm = *parsed;
  if (job.empty())
    throw usage_error("give the job to cancel: caf-hvd cancel JOB ('caf-hvd status' lists them)");
  // job ids are HOST-PID-N (make_job_id): letters, digits, '.', '-', '_'
  if (job.size() > 300 || std::any_of(job.begin(), job.end(), [](unsigned char c) {
        return !std::isalnum(c) && c != '.' && c != '-' && c != '_';
      }))
    throw usage_error(fmt::format("'{}' is not a job id (as 'caf-hvd status' lists them: "
                                  "HOST-PID-NUMBER)",
                                  printable(job)));
  auto address = cluster_option(where, "");
  auto creds = credentials_for({vm.count("insecure") > 0, vm.count("cluster-dir") > 0, cluster},
                               vm.count("admin") ? cert_role::admin : cert_role::driver);
  hvd_config cfg;
  cfg.enable_network(liveness{}, creds ? &*creds : nullptr);
  int rc = 0;
  {
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    auto got = table_at(sys, self, address, creds.has_value(), std::chrono::seconds(10));
    std::string error;
    std::vector<std::string> nodes;
    if (auto* t = std::get_if<std::pair<cluster_actor, caf::node_id>>(&got)) {
      signed_ticket ticket;
      if (creds)
        ticket = net::module().sign_ticket(
            *creds, ticket_body("cancel", to_string(t->second), job, unix_s()));
      self->request(t->first, std::chrono::seconds(10), cancel_atom::value, job, ticket)
          .receive(
              [&](std::string& why, std::vector<std::string>& told) {
                error = why;
                nodes = std::move(told);
              },
              [&](caf::error& e) { error = sys.render(e); });
    } else {
      error = std::get<std::string>(got);
    }
    if (error.empty()) {
      std::cout << fmt::format("cancelled job {}: its ranks stop on {} (SIGTERM, SIGKILL after "
                               "the job's grace period)\n",
                               job, fmt::join(nodes, ", "));
    } else {
      std::cerr << fmt::format("caf-hvd cancel: error: {}\n", error);
      rc = 1;
    }
    exit_watchdog(rc);
  }
  return rc;
}

int run_status(int argc, char** argv, bool jobs_only) {
  po::options_description desc{
      jobs_only
          ? "caf-hvd jobs: the cluster's jobs (owner, ranks, where they run, since when, and "
            "whether they run, start on slots held for them or wait in line), from the table "
            "its agents joined.\n\n"
            "usage: caf-hvd jobs [--cluster HOST[:PORT]] [--cluster-dir DIR] [--json]\n\noptions"
          : "caf-hvd status: the cluster's nodes (state, slots, GPUs, labels, last seen) and "
            "its jobs, from the table its agents joined.\n\n"
            "usage: caf-hvd status [--cluster HOST[:PORT]] [--cluster-dir DIR] [--json]\n\n"
            "options"};
  std::string cluster, where;
  double timeout = 10;
  desc.add_options()("help,h", "show this help")(
      "cluster", po::value(&where),
      "HOST[:PORT]: an agent of the cluster (the one the others joined, or any that joined "
      "it); default: $CAF_HVD_CLUSTER, else the installed agent's /etc/default/caf-hvd-node "
      "(the agent it joins, or itself)")("cluster-dir", po::value(&cluster),
                                         "the cluster's credentials (a driver certificate)")(
      "insecure", "talk to agents started with --insecure")(
      "json", "print the table as JSON (for scripts)")(
      "timeout", po::value(&timeout)->default_value(10), "seconds to wait for an answer");
  auto parsed = parse_options_only(argc, argv, desc, jobs_only ? "jobs" : "status");
  if (!parsed)
    return 0;
  auto& vm = *parsed;
  auto address = cluster_option(where, " (an agent of it)");
  if (!(timeout > 0 && timeout <= 3600))
    throw usage_error(fmt::format("--timeout {}: give seconds from 0 to 3600", timeout));
  auto creds = credentials_for({vm.count("insecure") > 0, vm.count("cluster-dir") > 0, cluster},
                               cert_role::driver);
  hvd_config cfg;
  cfg.enable_network(liveness{}, creds ? &*creds : nullptr);
  int rc = 0;
  {
    caf::actor_system sys{cfg};
    auto wait = std::chrono::milliseconds(static_cast<long>(timeout * 1000));
    auto got = fetch(sys, address, creds, wait);
    // An agent that joined another says where the table is: asked there, once.
    if (auto* v = std::get_if<cluster_view>(&got); v && !v->redirect.empty()) {
      try {
        auto next = parse_cluster_address(v->redirect, default_node_port);
        got = fetch(sys, next, creds, wait);
      } catch (const std::exception& e) {
        got = fmt::format("the agent points to '{}': {}", printable(v->redirect), e.what());
      }
      if (auto* again = std::get_if<cluster_view>(&got); again && !again->redirect.empty())
        got = fmt::format("the agent at {} joined {}, which joined {} in turn: no table found",
                          where, v->redirect, again->redirect);
    }
    if (auto* v = std::get_if<cluster_view>(&got)) {
      if (vm.count("json"))
        std::cout << json_text(jobs_only ? jobs_json(*v) : status_json(*v)) << "\n";
      else
        std::cout << (jobs_only ? render_jobs(*v) : render_status(*v));
      std::cout << std::flush;
    } else {
      std::cerr << "caf-hvd " << (jobs_only ? "jobs" : "status")
                << ": error: " << std::get<std::string>(got) << "\n";
      rc = 1;
    }
    exit_watchdog(rc);
  }
  return rc;
}

} // namespace cafhvd::cli
