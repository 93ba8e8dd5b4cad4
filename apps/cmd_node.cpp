// caf-hvd node: a node agent that runs ranks for drivers. Its options become a
// node_options value; start_node starts the actor system, opens the port and waits for
// the signal that stops it (SIGHUP re-reads the credentials).
#include <arpa/inet.h>
#include <netdb.h>
#include <pwd.h>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include "actors/cluster.hpp"
#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "actors/protocol.hpp"
#include "apps/cli.hpp"
#include "runtime/observe/text.hpp"
#include "runtime/cluster/credential_files.hpp"
#include "runtime/cluster/agent_state.hpp"
#include "runtime/network/net.hpp"
#include "runtime/cluster/gpu.hpp"
#include "runtime/job/host_spec.hpp"
#include "runtime/cluster/membership.hpp"

namespace cafhvd::cli {

namespace {

// What `caf-hvd node` was asked, validated.
struct node_options {
  int port = default_node_port;
  std::string name, bind;
  int slots = 0;
  gpu_inventory inventory;
  liveness link;
  uint64_t max_message = 0; // the wire guard's payload cap (bytes)
  std::optional<cluster_credentials> creds; // nullopt: --insecure
  bool exit_on_stdin_eof = false;
  std::vector<std::string> labels; // KEY=VALUE, checked
  std::string join_host;           // --join HOST[:PORT] ("" = none: it may hold a table)
  int join_port = default_node_port;
  double drain_grace = 0; // SIGTERM: drain, wait this long for the ranks, then stop
  rank_user_policy rank_policy;
  std::string state_dir;              // --state-dir ("" = none)
  std::optional<std::string> drained; // the drain kept there, read at the start
};

// Explains why a port cannot be opened (CAF only says that it failed).
std::string bind_problem(const std::string& bind, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind.empty())
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  else if (inet_pton(AF_INET, bind.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return fmt::format("'{}' is not an IPv4 address", bind);
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string why = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0
                        ? std::strerror(errno)
                        : "unknown reason";
  ::close(fd);
  return why;
}

// The node's options, or nullopt after printing --help.
std::optional<node_options> parse_node_options(int argc, char** argv) {
  po::options_description desc{"caf-hvd node: a node agent that runs ranks for drivers.\n"
                               "SIGTERM or SIGINT stop it (its ranks first); SIGHUP re-reads "
                               "its credentials (a new crl.pem).\n\n"
                               "usage: caf-hvd node [--port PORT] [--name NAME] [--slots N] "
                               "[--bind ADDR]\n\noptions"};
  int port = default_node_port;
  std::string name, bind, cluster, gpus, join, rank_user = "owner", job_account, state_dir;
  // $CAF_HVD_RANK_USER: the default of --rank-user (a test harness that starts agents as
  // root with throw-away certificates sets it to agent)
  if (const char* env = std::getenv("CAF_HVD_RANK_USER"); env && *env)
    rank_user = env;
  std::vector<std::string> labels;
  int slots = 0;
  double drain_grace = 0;
  double link_timeout = liveness::default_seconds;
  double max_message_mb = 257;
  desc.add_options()("help,h", "show this help")(
      "port,p", po::value(&port)->default_value(default_node_port),
      "TCP port to listen on")("name", po::value(&name),
                               "the host's identity in jobs (HOROVOD_HOSTNAME); default: hostname")(
      "slots", po::value(&slots)->default_value(0),
      "ranks this node runs at once, for all jobs together (each rank holds one slot until it is gone); 0 = no limit (GPU jobs: one per free GPU group)")(
      "gpus", po::value(&gpus),
      "LIST|none|auto: this node's GPUs as CUDA device indices (e.g. 0,1,2,3); auto (or "
      "empty, the default): detected (NVML, else nvidia-smi -L)")(
      "bind", po::value(&bind), "address to listen on; default: every interface")(
      "cluster-dir", po::value(&cluster), "the cluster's credentials (see 'caf-hvd cluster init')")(
      "insecure", "admit any driver without TLS (trusted networks only)")(
      "link-timeout", po::value(&link_timeout)->default_value(liveness::default_seconds),
      "seconds without a byte from a driver before its link counts as dead and its jobs' "
      "ranks are stopped (heartbeats keep idle links alive)")(
      "exit-on-stdin-eof",
      "stop (as on SIGTERM) when stdin ends: an agent started over ssh for one job ends "
      "with the session that started it")(
      "join", po::value(&join),
      fmt::format("HOST[:PORT] (default port {}): join the cluster whose table that agent "
                  "holds (any agent started without --join holds one); the agent stays joined "
                  "and joins again when that agent comes back",
                  default_node_port)
          .c_str())(
      "label", po::value(&labels)->composing(),
      "KEY=VALUE: a label of this node in the cluster's table (repeatable)")(
      "drain-grace", po::value(&drain_grace)->default_value(0),
      "SECONDS: on SIGTERM (a spot VM's preemption notice, systemctl stop), first drain: no "
      "new jobs, elastic jobs leave this node at their next commit; stop once its ranks are "
      "gone or when the grace ends (0: stop at once)")(
      "rank-user", po::value(&rank_user)->default_value(rank_user),
      "owner: run each job's ranks as the account named like its owner (the driver "
      "certificate's name), when this agent can switch users (root, or CAP_SETUID and "
      "CAP_SETGID), else as this agent's user; agent: always as this agent's user (default: "
      "$CAF_HVD_RANK_USER, else owner)")(
      "job-account", po::value(&job_account),
      "ACCOUNT: the account ranks run as when their owner has none on this node (default: "
      "such jobs are refused)")(
      "max-message-mb", po::value(&max_message_mb)->default_value(257),
      "MB: the largest message a peer may send this agent (a larger frame closes its "
      "connection before it is read); at least 257, an executor frame of 256 MB and its "
      "call: raise it with drivers' --executor-max-frame-mb")(
      "allow-root-ranks", "an owner named like a uid-0 account runs ranks as root (never by "
      "default)")(
      "state-dir", po::value(&state_dir),
      "DIR: where the agent keeps what outlives it: an administrator's drain (DIR/drained), "
      "so that a restarted agent stays drained until undrained, and the members of the table "
      "it holds (DIR/members), which a restarted table waits for (up to 10 s) before its "
      "answers are final; empty (the default): nothing is kept");
  auto parsed = parse_options_only(argc, argv, desc, "node");
  if (!parsed)
    return std::nullopt; // --help
  auto& vm = *parsed;
  if (port < 0 || port > 65535)
    throw usage_error(fmt::format("--port {} is out of range [0, 65535]", port));
  if (slots < 0)
    throw usage_error(fmt::format("--slots {} must not be negative", slots));
  if (name.empty())
    name = this_hostname();
  if (!valid_host_name(name))
    throw usage_error(
        fmt::format("--name '{}': use 1 to 255 letters, digits, '.', '-' or '_'", printable(name)));

  gpu_inventory inventory;
  // "auto" and "" are the service's default configuration (an unset value in it).
  if (vm.count("gpus") && gpus != "auto" && !gpus.empty()) {
    try {
      inventory = {parse_gpu_list(gpus), "--gpus"};
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  } else {
    inventory = detect_gpus();
  }

  liveness link;
  try {
    link = liveness::from_seconds(link_timeout);
  } catch (const std::exception& e) {
    throw usage_error(e.what());
  }
  std::vector<std::string> checked_labels;
  try {
    checked_labels = parse_labels(labels);
  } catch (const std::exception& e) {
    throw usage_error(e.what());
  }
  std::string join_host;
  int join_port = default_node_port;
  if (!join.empty()) {
    try {
      auto a = parse_cluster_address(join, default_node_port);
      join_host = a.host;
      join_port = a.port;
    } catch (const std::exception& e) {
      throw usage_error(fmt::format("--join '{}': {}", printable(join), e.what()));
    }
  }
  auto creds = credentials_for({vm.count("insecure") > 0, vm.count("cluster-dir") > 0, cluster},
                               cert_role::node);
  if (creds && !join_host.empty())
    if (auto why = net::module().join_problem(*creds); !why.empty())
      throw std::runtime_error(fmt::format("--join: {}", why));
  node_options n;
  n.port = port;
  n.name = name;
  n.bind = bind;
  n.slots = slots;
  n.inventory = std::move(inventory);
  n.link = link;
  n.creds = std::move(creds);
  n.exit_on_stdin_eof = vm.count("exit-on-stdin-eof") > 0;
  n.labels = std::move(checked_labels);
  if (rank_user != "owner" && rank_user != "agent")
    throw usage_error(fmt::format("--rank-user '{}': give owner or agent", printable(rank_user)));
  n.rank_policy.mode = rank_user == "owner" ? rank_user_mode::owner : rank_user_mode::agent;
  n.rank_policy.job_account = job_account;
  n.rank_policy.allow_root = vm.count("allow-root-ranks") > 0;
  if (!(max_message_mb >= 257 && max_message_mb <= 4095))
    throw usage_error(fmt::format("--max-message-mb {}: give megabytes from 257 to 4095",
                                  max_message_mb));
  n.max_message = static_cast<uint64_t>(max_message_mb * 1024 * 1024);
  if (!(drain_grace >= 0 && drain_grace <= 86400))
    throw usage_error(fmt::format("--drain-grace {}: give seconds from 0 to 86400", drain_grace));
  n.drain_grace = drain_grace;
  n.join_host = join_host;
  n.join_port = join_port;
  if (!state_dir.empty()) {
    try {
      n.drained = read_drain_mark(state_dir);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("--state-dir: {}", e.what()));
    }
    n.state_dir = state_dir;
  }
  return n;
}

// Why this host's own name does not resolve, or empty. Real Horovod's hvd.init() ends
// with SIGSEGV on such a host: its process sets' Gloo device is made with no interface,
// so Gloo looks the host name up and reads the failed lookup's result.
std::string own_name_problem() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0)
    return fmt::format("gethostname: {}", std::strerror(errno));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rv = getaddrinfo(host, nullptr, &hints, &found);
  if (found)
    freeaddrinfo(found);
  if (rv == 0)
    return {};
  return fmt::format("this host's name '{}' does not resolve ({})", printable(host),
                     gai_strerror(rv));
}

// Runs the agent until SIGINT or SIGTERM; returns the exit code.
int start_node(const node_options& o) {
  const auto& name = o.name;
  const auto& bind = o.bind;
  const int port = o.port;
  const auto& creds = o.creds;
  block_termination_signals();
  hvd_config cfg;
  // (the sharing scheduler, as every caf-hvd process: actors/config.cpp)
  cfg.node->name = name;
  cfg.node->slots = static_cast<uint32_t>(o.slots);
  cfg.node->jobs->set_capacity(static_cast<uint32_t>(o.slots));
  cfg.node->shim = shim_path();
  cfg.node->gpus = std::make_shared<gpu_pool>(o.inventory.devices);
  cfg.node->gpu_source = o.inventory.source;
  cfg.node->creds = creds;
  cfg.node->labels = o.labels;
  cfg.node->rank_policy = o.rank_policy;
  cfg.node->switch_users = o.rank_policy.mode == rank_user_mode::owner && can_switch_users();
  cfg.node->bind = bind;
  cfg.node->link_timeout = o.link.timeout;
  cfg.node->state_dir = o.state_dir;
  if (o.drained)
    cfg.node->draining->store(true); // before any job can reach it
  cfg.node->started_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  // A join the cluster refuses ends the agent: say why, exit 1.
  static std::atomic<bool> fatal_seen{false};
  cfg.node->fatal = [name](const std::string& why) {
    if (fatal_seen.exchange(true))
      return;
    std::cerr << fmt::format("caf-hvd node '{}': error: {}\n", name, why) << std::flush;
    ::kill(::getpid(), SIGTERM);
  };
  cfg.enable_network(o.link, creds ? &*creds : nullptr);
  net::module().set_wire_cap(o.max_message);
  caf::actor_system sys{cfg};
  cfg.node->guardian = spawn_guardian(sys);
  auto join_target =
      o.join_host.empty() ? std::string{} : fmt::format("{}:{}", o.join_host, o.join_port);
  auto table = spawn_cluster_table(sys, join_target);
  auto opened = net::module().open(sys, static_cast<uint16_t>(port), bind, creds.has_value(),
                                   caf::actor_cast<caf::actor>(table));
  int rc = 0;
  caf::actor joiner;
  uint64_t stop_token = std::random_device{}() * 4294967296ull + std::random_device{}() + 1;
  if (!opened) {
    std::cerr << fmt::format("caf-hvd node: cannot listen on {}:{}: {}\n",
                             bind.empty() ? "*" : bind, port, bind_problem(bind, port));
    rc = 1;
  } else {
    std::cout << fmt::format("caf-hvd node '{}' listening on {}:{} ({})\n", name,
                             bind.empty() ? "*" : bind, *opened,
                             creds ? "mutual TLS, cluster " + creds->dir : "INSECURE")
              << std::flush;
    {
      auto& pol = o.rank_policy;
      char who[256] = "?";
      if (auto* pw = ::getpwuid(::geteuid()))
        std::snprintf(who, sizeof(who), "%s", pw->pw_name);
      if (cfg.node->switch_users)
        std::cerr << fmt::format(
            "caf-hvd node '{}': ranks run as their owner's account (named like the driver "
            "certificate){}{}\n",
            name,
            pol.job_account.empty()
                ? std::string{"; jobs of owners without one are refused"}
                : fmt::format("; owners without one: the job account '{}'",
                              printable(pol.job_account)),
            pol.allow_root ? "; root may be an owner (--allow-root-ranks)" : "");
      else
        std::cerr << fmt::format(
            "caf-hvd node '{}': ranks run as this agent's user '{}'{}\n", name, printable(who),
            pol.mode == rank_user_mode::agent
                ? std::string{" (--rank-user agent)"}
                : std::string{" (it cannot switch users: not root, and without CAP_SETUID and "
                              "CAP_SETGID)"});
    }
    if (o.drained)
      std::cerr << fmt::format("caf-hvd node '{}': drained, as before this start ({}: {}): "
                               "no new jobs until 'caf-hvd undrain {}'\n",
                               name, drain_mark_path(o.state_dir), printable(*o.drained),
                               name)
                << std::flush;
    if (auto why = own_name_problem(); !why.empty())
      std::cerr << fmt::format("caf-hvd node '{}': warning: {}: real Horovod's hvd.init() ends "
                               "with SIGSEGV on such a host; add the name to /etc/hosts or "
                               "the DNS\n",
                               name, why)
                << std::flush;
    cfg.node->port = *opened;
    if (!o.join_host.empty())
      joiner = spawn_joiner(sys, o.join_host, static_cast<uint16_t>(o.join_port),
                            creds.has_value(), stop_token);
    if (o.exit_on_stdin_eof) {
      std::thread{[name] {
        char buf[256];
        while (true) {
          auto n = ::read(0, buf, sizeof(buf));
          if (n == 0 || (n < 0 && errno != EINTR))
            break;
        }
        std::cerr << fmt::format("caf-hvd node '{}': stdin ended (the session that started it "
                                 "is gone)\n",
                                 name);
        ::kill(::getpid(), SIGTERM);
      }}.detach();
    }
    // SIGHUP re-reads the credentials (a new crl.pem); SIGINT and SIGTERM stop the agent.
    auto set = termination_signals();
    int sig = 0;
    std::string stop_why; // what the ranks' exit reports say stopped them
    while (true) {
      if (sigwait(&set, &sig) != 0)
        continue;
      if (sig == SIGTERM && o.drain_grace > 0 && !fatal_seen) {
        // Drain first: no new jobs, reported to the cluster (elastic jobs leave at their
        // next commit); the ranks' end, the grace or another signal ends the wait. Every
        // job with ranks here is told now, not when its ranks are stopped.
        if (!cfg.node->draining->exchange(true))
          post_from(cfg.node->guardian, drain_atom::value, true,
                         fmt::format("its agent received SIGTERM and stops within {} s "
                                     "(--drain-grace)",
                                     o.drain_grace));
        auto ranks = [&] {
          uint32_t n = 0;
          for (auto& j : cfg.node->jobs->snapshot())
            n += j.ranks;
          return n;
        };
        std::cerr << fmt::format("caf-hvd node '{}': SIGTERM: draining, waiting up to {} s for "
                                 "its {} rank{}\n",
                                 name, o.drain_grace, ranks(), ranks() == 1 ? "" : "s")
                  << std::flush;
        auto until = std::chrono::steady_clock::now()
                     + std::chrono::milliseconds(static_cast<long>(o.drain_grace * 1000));
        bool again = false;
        while (ranks() > 0 && std::chrono::steady_clock::now() < until) {
          timespec ts{0, 100'000'000};
          if (sigtimedwait(&set, nullptr, &ts) > 0) {
            again = true;
            break;
          }
        }
        auto left = ranks();
        if (left > 0 && !again)
          stop_why = fmt::format("node agent '{}' was drained (SIGTERM) and its --drain-grace "
                                 "of {} s ended",
                                 name, o.drain_grace);
        std::cerr << fmt::format("caf-hvd node '{}': {}\n", name,
                                 left == 0 ? std::string{"drained: no ranks left"}
                                 : again   ? fmt::format("a second signal: stopping {} ranks", left)
                                           : fmt::format("the drain grace ended with {} rank{} "
                                                         "left: stopping them",
                                                         left, left == 1 ? "" : "s"))
                  << std::flush;
        break;
      }
      if (sig != SIGHUP)
        break;
      if (!creds) {
        std::cerr << fmt::format("caf-hvd node '{}': SIGHUP: nothing to reload (--insecure)\n",
                                 name);
        continue;
      }
      try {
        // The same checks as at the start (a list not signed by the CA, this agent's
        // own certificate revoked) before the new list takes effect.
        auto& net = net::module();
        auto fresh = net.load_cluster(creds->dir, creds->role);
        net.install_tls(fresh);
        std::cerr << fmt::format("caf-hvd node '{}': SIGHUP: reloaded the credentials in {}{}\n",
                                 name, creds->dir,
                                 fresh.crl.empty() ? "" : " (revocation list " + fresh.crl + ")");
      } catch (const std::exception& e) {
        std::cerr << fmt::format("caf-hvd node '{}': SIGHUP: kept the previous credentials: {}\n",
                                 name, e.what());
      }
    }
    if (fatal_seen)
      rc = 1;
    else
      std::cerr << fmt::format("caf-hvd node '{}': {} received, stopping its jobs' ranks\n",
                               name, strsignal(sig));
    caf::scoped_actor leaving{sys};
    if (joiner) // the table hears that this agent stops, not only that its link broke
      leaving->request(joiner, std::chrono::seconds(2), left_atom::value, stop_token)
          .receive([](bool) {}, [](caf::error&) {});
    // Ranks stop as a driver stops them (SIGTERM, the job's grace, SIGKILL) and their
    // exits reach the drivers, saying that this agent stopped them.
    caf::scoped_actor self{sys};
    self->monitor(cfg.node->guardian);
    post_from(cfg.node->guardian, shutdown_atom::value,
               stop_why.empty() ? fmt::format("node agent '{}' received {}", name, strsignal(sig))
                                : stop_why);
    self->receive([](caf::down_msg&) {},
                  caf::after(std::chrono::seconds(40)) >>
                      [&] {
                        std::cerr << fmt::format(
                            "caf-hvd node '{}': ranks did not stop within 40 s; "
                            "exiting\n",
                            name);
                      });
  }
  post_from(cfg.node->guardian, shutdown_atom::value);
  caf::anon_send_exit(table, caf::exit_reason::user_shutdown);
  if (joiner)
    caf::anon_send_exit(joiner, caf::exit_reason::user_shutdown);
  exit_watchdog(rc);
  return rc;
}

} // namespace

int run_node(int argc, char** argv) {
  auto options = parse_node_options(argc, argv);
  if (!options)
    return 0;
  return start_node(*options);
}

} // namespace cafhvd::cli
