// caf-hvd: `node` runs a node agent, `driver` runs a job across node agents, `run` runs a
// whole job on this machine. This file only parses arguments and starts actor systems.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <optional>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <iostream>
#include <netdb.h>
#include <arpa/inet.h>
#include <thread>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <caf/openssl/all.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/config.hpp"
#include "actors/driver.hpp"
#include "actors/driver_util.hpp"
#include "actors/protocol.hpp"
#include "runtime/allocation.hpp"
#include "runtime/credentials.hpp"
#include "runtime/env.hpp"
#include "runtime/gpu.hpp"
#include "runtime/host_spec.hpp"
#include "runtime/dashboard.hpp"
#include "runtime/timeline.hpp"
#include "runtime/nic.hpp"
#include "runtime/nic_probe.hpp"
#include "runtime/process.hpp"
#include "runtime/ssh_launch.hpp"

extern char** environ;

namespace po = boost::program_options;
using namespace cafhvd;

namespace {

constexpr const char* version = "0.1.0";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Signals that end a process gracefully are blocked in every thread (set before CAF
// starts its threads) and taken with sigtimedwait, so no handler runs inside CAF.
sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

void block_termination_signals() {
  auto set = termination_signals();
  sigaddset(&set, SIGUSR2); // wakes the driver's signal thread
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

std::string this_hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string shim_path() {
  auto path = executable_dir() + "/caf-hvd-exec";
  if (access(path.c_str(), X_OK) != 0)
    throw std::runtime_error(
        fmt::format("cannot find the rank launcher {} (it is built and installed next to "
                    "caf-hvd)",
                    path));
  return path;
}

std::string resolve_or_fail(const std::string& host) {
  std::string error;
  auto a = resolve_ipv4(host, &error);
  if (!a)
    throw usage_error(fmt::format("cannot resolve host '{}': {}", host, error));
  return *a;
}

// Creates --output-filename's directory (with parents) and checks that it is writable,
// so that a typo fails before any rank starts.
void prepare_output_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw usage_error(fmt::format("--output-filename {}: cannot create it: {}", dir, ec.message()));
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    throw usage_error(
        fmt::format("--output-filename {}: not writable: {}", dir, std::strerror(errno)));
}

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

// The credentials a node or driver uses, or nullopt with --insecure (after a warning).
std::optional<cluster_credentials> credentials_for(const po::variables_map& vm,
                                                   const std::string& dir, cert_role role) {
  const char* who = to_string(role);
  if (vm.count("insecure")) {
    if (vm.count("cluster-dir"))
      throw usage_error("--insecure and --cluster-dir exclude each other");
    std::cerr << fmt::format(
        "caf-hvd {}: WARNING: --insecure: no TLS, no admission; anyone who can reach the "
        "node port can run commands there. Use only on a trusted network.\n",
        who);
    return std::nullopt;
  }
  try {
    auto c = load_cluster(cluster_dir(dir.empty() ? std::nullopt : std::optional{dir}), role);
    if (c.role == cert_role::member)
      std::cerr << fmt::format(
          "caf-hvd {}: WARNING: {} is a pre-role member certificate (it can act as driver and "
          "as node); issue a {} certificate with 'caf-hvd cluster add-{} NAME' and revoke the "
          "member certificate\n",
          who, c.cert, who, who);
    return c;
  } catch (const credentials_error& e) {
    throw std::runtime_error(e.what());
  }
}

constexpr const char* cluster_usage =
    "usage:\n"
    "  caf-hvd cluster init [DIR]                        a new CA, a node and a driver "
    "certificate\n"
    "  caf-hvd cluster add-node NAME [DIR] [--out OUT]   a node agent's credentials\n"
    "  caf-hvd cluster add-driver NAME [DIR] [--out OUT] a driver's credentials\n"
    "  caf-hvd cluster revoke NAME|CERT.pem [DIR]        revoke NAME's certificates (crl.pem)\n"
    "DIR: the cluster's directory (default $CAF_HVD_CLUSTER_DIR, else "
    "~/.config/caf-hvd/cluster); OUT: default DIR/issued/NAME";

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
  bool named = verb == "add-node" || verb == "add-driver" || verb == "revoke";
  if ((verb != "init" && !named) || (named && args.size() < 2) || args.size() > (named ? 3u : 2u)
      || (!out.empty() && (verb == "init" || verb == "revoke")))
    throw usage_error(cluster_usage);
  auto dir_arg =
      args.size() > (named ? 2u : 1u) ? std::optional<std::string>{args.back()} : std::nullopt;
  auto dir = cluster_dir(dir_arg);
  try {
    if (verb == "init") {
      init_cluster(dir);
      std::cout << fmt::format(
          "created the cluster's credentials in {}:\n"
          "  ca.pem, ca.key          the cluster's CA (keep ca.key on this machine only)\n"
          "  node.pem, node.key      a node agent's certificate (role node: accepts drivers)\n"
          "  driver.pem, driver.key  a driver's certificate (role driver: drives node agents)\n"
          "On a trusted single machine, use {} as it is. For a cluster, give each host its own "
          "directory with 'caf-hvd cluster add-node HOST' and each head node one with "
          "'caf-hvd cluster add-driver NAME', and pass it with --cluster-dir or "
          "CAF_HVD_CLUSTER_DIR.\n",
          dir, dir);
    } else if (verb == "revoke") {
      auto serials = revoke_credentials(dir, args[1]);
      std::cout << fmt::format(
          "revoked {} certificate(s) named '{}' (serial {}); {}/crl.pem now lists them.\n"
          "Copy crl.pem into the cluster directory of every host and head node, then send "
          "SIGHUP to running node agents (drivers read it when they start).\n",
          serials.size(), args[1], fmt::join(serials, ", "), dir);
    } else {
      auto role = verb == "add-node" ? cert_role::node : cert_role::driver;
      auto target = issue_credentials(dir, role, args[1], out);
      std::cout << fmt::format(
          "issued a {} certificate for '{}' in {} (ca.pem, {}.pem, {}.key{}).\n"
          "Copy that directory to the {} and pass it with --cluster-dir or "
          "CAF_HVD_CLUSTER_DIR.\n",
          to_string(role), args[1], target, to_string(role), to_string(role),
          ::access((target + "/crl.pem").c_str(), F_OK) == 0 ? ", crl.pem" : "",
          role == cert_role::node ? "host" : "head node");
    }
  } catch (const credentials_error& e) {
    throw std::runtime_error(e.what());
  }
  return 0;
}

// The job is decided; CAF's shutdown may still wait on a connection attempt blocked in
// its OpenSSL module (a peer that never answers the handshake), which has no timeout.
// Give the actor system a few seconds to wind down, then leave with the job's code.
void exit_watchdog(int code) {
  std::thread{[code] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }}.detach();
}

// Splits argv into caf-hvd's options and the command: the command starts at "--" or at
// the first argument that is neither an option nor an option's value, so
// `caf-hvd run -np 2 python3 train.py --lr 0.1` passes `--lr 0.1` to the program.
std::pair<std::vector<std::string>, std::vector<std::string>>
split_command(int argc, char** argv, const po::options_description& desc) {
  std::vector<std::string> opts, cmd;
  auto lookup = [&](const std::string& token) -> const po::option_description* {
    auto name = token.substr(token.find_first_not_of('-'));
    name = name.substr(0, name.find('='));
    if (auto* d = desc.find_nothrow(name, false, false, false))
      return d; // --name, or -name (long options may be written with one dash)
    if (token.size() >= 2 && token[1] != '-')
      return desc.find_nothrow(token.substr(0, 2), false, false, false); // -x
    return nullptr;
  };
  int i = 2;
  for (; i < argc; ++i) {
    std::string token = argv[i];
    if (token == "--") {
      ++i;
      break;
    }
    if (token.size() < 2 || token[0] != '-')
      break; // the command
    opts.push_back(token);
    auto* d = lookup(token);
    if (!d || token.find('=') != std::string::npos)
      continue; // unknown options are reported by the parser
    bool short_with_value = token.size() > 2 && token[1] != '-' && d->long_name().empty();
    if (short_with_value)
      continue; // -xVALUE
    auto max = d->semantic()->max_tokens();
    for (unsigned n = 0; n < max && i + 1 < argc; ++n) {
      std::string next = argv[i + 1];
      // Multi-value options (the cooldown range) take numbers only.
      bool number = !next.empty() && next.find_first_not_of("0123456789.") == std::string::npos;
      if (n > 0 && !number)
        break;
      opts.push_back(next);
      ++i;
    }
  }
  for (; i < argc; ++i)
    cmd.emplace_back(argv[i]);
  return {opts, cmd};
}

po::variables_map parse(const std::vector<std::string>& args, const po::options_description& desc,
                        const po::positional_options_description* pos = nullptr) {
  po::variables_map vm;
  try {
    po::command_line_parser parser{args};
    parser.options(desc).style(
        (po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
        | po::command_line_style::allow_long_disguise);
    if (pos)
      parser.positional(*pos);
    po::store(parser.run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw usage_error(e.what());
  }
  return vm;
}

// -- node ----------------------------------------------------------------------------

int run_node(int argc, char** argv) {
  po::options_description desc{"caf-hvd node: a node agent that runs ranks for drivers.\n"
                               "SIGTERM or SIGINT stop it (its ranks first); SIGHUP re-reads "
                               "its credentials (a new crl.pem).\n\n"
                               "usage: caf-hvd node [--port PORT] [--name NAME] [--slots N] "
                               "[--bind ADDR]\n\noptions"};
  int port = default_node_port;
  std::string name, bind, cluster, gpus;
  int slots = 0;
  double link_timeout = liveness::default_seconds;
  desc.add_options()("help,h", "show this help")(
      "port,p", po::value(&port)->default_value(default_node_port),
      "TCP port to listen on")("name", po::value(&name),
                               "the host's identity in jobs (HOROVOD_HOSTNAME); default: hostname")(
      "slots", po::value(&slots)->default_value(0),
      "ranks this node accepts per job; 0 = no limit (GPU jobs: one per free GPU group)")(
      "gpus", po::value(&gpus),
      "LIST|none|auto: this node's GPUs as CUDA device indices (e.g. 0,1,2,3); auto (or "
      "empty, the default): detected (NVML, else nvidia-smi -L)")("bind", po::value(&bind),
                                    "address to listen on; default: every interface")(
      "cluster-dir", po::value(&cluster), "the cluster's credentials (see 'caf-hvd cluster init')")(
      "insecure", "admit any driver without TLS (trusted networks only)")(
      "link-timeout", po::value(&link_timeout)->default_value(liveness::default_seconds),
      "seconds without a byte from a driver before its link counts as dead and its jobs' "
      "ranks are stopped (heartbeats keep idle links alive)")(
      "exit-on-stdin-eof",
      "stop (as on SIGTERM) when stdin ends: an agent started over ssh for one job ends "
      "with the session that started it");
  auto [args, rest] = split_command(argc, argv, desc);
  if (!rest.empty())
    throw usage_error("caf-hvd node takes no command");
  auto vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (port < 0 || port > 65535)
    throw usage_error(fmt::format("--port {} is out of range [0, 65535]", port));
  if (slots < 0)
    throw usage_error(fmt::format("--slots {} must not be negative", slots));
  if (name.empty())
    name = this_hostname();
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
      throw usage_error(fmt::format("--name '{}': use letters, digits, '.', '-' or '_'", name));

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
  auto creds = credentials_for(vm, cluster, cert_role::node);

  block_termination_signals();
  hvd_config cfg;
  // (the sharing scheduler, as every caf-hvd process: actors/config.cpp)
  cfg.node->name = name;
  cfg.node->slots = static_cast<uint32_t>(slots);
  cfg.node->shim = shim_path();
  cfg.node->gpus = std::make_shared<gpu_pool>(inventory.devices);
  cfg.node->gpu_source = inventory.source;
  cfg.enable_network(link, creds ? &*creds : nullptr);
  caf::actor_system sys{cfg};
  cfg.node->guardian = spawn_guardian(sys);
  caf::expected<uint16_t> opened{caf::sec::runtime_error};
  if (creds) {
    caf::scoped_actor self{sys};
    self->request(sys.openssl_manager().actor_handle(), std::chrono::seconds(10),
                  caf::open_atom::value, static_cast<uint16_t>(port), bind, true)
        .receive([&](uint16_t p) { opened = p; }, [&](caf::error& e) { opened = std::move(e); });
  } else {
    opened = sys.middleman().open(static_cast<uint16_t>(port),
                                  bind.empty() ? nullptr : bind.c_str(), true);
  }
  int rc = 0;
  if (!opened) {
    std::cerr << fmt::format("caf-hvd node: cannot listen on {}:{}: {}\n",
                             bind.empty() ? "*" : bind, port, bind_problem(bind, port));
    rc = 1;
  } else {
    std::cout << fmt::format("caf-hvd node '{}' listening on {}:{} ({})\n", name,
                             bind.empty() ? "*" : bind, *opened,
                             creds ? "mutual TLS, cluster " + creds->dir : "INSECURE")
              << std::flush;
    if (vm.count("exit-on-stdin-eof")) {
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
    while (true) {
      if (sigwait(&set, &sig) != 0)
        continue;
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
        auto fresh = load_cluster(creds->dir, creds->role);
        install_tls(fresh);
        std::cerr << fmt::format("caf-hvd node '{}': SIGHUP: reloaded the credentials in {}{}\n",
                                 name, creds->dir,
                                 fresh.crl.empty() ? "" : " (revocation list " + fresh.crl + ")");
      } catch (const std::exception& e) {
        std::cerr << fmt::format("caf-hvd node '{}': SIGHUP: kept the previous credentials: {}\n",
                                 name, e.what());
      }
    }
    std::cerr << fmt::format("caf-hvd node '{}': {} received, stopping its jobs' ranks\n", name,
                             strsignal(sig));
    // Ranks stop as a driver stops them (SIGTERM, the job's grace, SIGKILL) and their
    // exits reach the drivers, saying that this agent stopped them.
    caf::scoped_actor self{sys};
    self->monitor(cfg.node->guardian);
    self->send(cfg.node->guardian, shutdown_atom::value,
               fmt::format("node agent '{}' received {}", name, strsignal(sig)));
    self->receive([](caf::down_msg&) {},
                  caf::after(std::chrono::seconds(40)) >>
                      [&] {
                        std::cerr << fmt::format(
                            "caf-hvd node '{}': ranks did not stop within 40 s; "
                            "exiting\n",
                            name);
                      });
  }
  caf::anon_send(cfg.node->guardian, shutdown_atom::value);
  exit_watchdog(rc);
  return rc;
}

// -- driver and run ------------------------------------------------------------------

struct job_options {
  po::options_description desc;    // everything the parser knows
  po::options_description visible; // what --help shows
  int np = 0;
  double start_timeout = 30, kill_grace = 5, link_timeout = liveness::default_seconds;
  std::string output_dir, hosts, hostfile, nics, cluster, torch_store = "auto";
  std::vector<std::string> env;
  std::vector<std::string> command;
  // horovodrun's and torchrun's spellings
  int gloo_timeout = 0, cycle_time_ms = 0, cache_capacity = -1;
  double fusion_threshold_mb = -1;
  std::string log_level, timeline, events, dashboard;
  double dashboard_keep = 0;
  // elastic (driver only)
  std::string discovery_script;
  int min_np = 0, max_np = 0, reset_limit = -1, slots_per_host = 0;
  double elastic_timeout = 600, discovery_interval = 1;
  std::vector<double> cooldown;
  // GPUs
  int gpus_per_slot = 0, cpus_per_slot = 0;
  std::string cuda_visible = "shared", local_gpus;
  // executor mode
  int executor_fd = -1;
  double max_frame_mb = 256;
  // agents over ssh
  std::string launcher = "none", ssh_identity, agent_path, ssh_command = "ssh",
              srun_command = "srun";
  int ssh_port = 0;
  std::vector<std::string> ssh_options;

  job_options(const std::string& title, bool with_hosts) : desc{title}, visible{title} {
    po::options_description job{"the job"}, hosts_opts{"hosts"}, elastic{"elastic jobs"},
        output{"output"}, net{"networking"}, torch{"torch.distributed"},
        compat{"horovodrun and torchrun spellings"}, gpu{"GPUs and CPUs"},
        exec{"executor mode (the caf_hvd Python "
             "package starts this)"},
        hidden;
    job.add_options()("help,h", "show this help")("np", po::value(&np),
                                                  "number of ranks (elastic: the initial minimum)")(
        "start-timeout", po::value(&start_timeout)->default_value(30),
        "seconds for every rank to be placed and started")(
        "kill-grace-seconds", po::value(&kill_grace)->default_value(5),
        "seconds between SIGTERM and SIGKILL when a job is stopped")(
        "env", po::value(&env)->composing(), "KEY=VALUE added to every rank (repeatable)")(
        "verbose", "print each step of the job with timings")("quiet",
                                                              "no summary at the end of the job");
    hosts_opts.add_options()("hosts,H", po::value(&hosts),
                             with_hosts ? "HOST:SLOTS or HOST:PORT:SLOTS, comma-separated"
                                        : "HOST:SLOTS naming this machine only (e.g. "
                                          "localhost:4; -np defaults to the slots)")(
        "hostfile", po::value(&hostfile),
        with_hosts ? "file of 'HOST[:PORT] slots=N' lines" : "a hostfile naming this machine only");
    if (with_hosts)
      hosts_opts.add_options()(
          "launcher", po::value(&launcher)->default_value("none"),
          "none|ssh|slurm: start a node agent on every host for this job and stop it at "
          "the end (ssh: one session per host; slurm: one srun step over the allocation); "
          "none: agents are already running")("ssh-port,p", po::value(&ssh_port),
                                              "--launcher ssh: the hosts' ssh port (horovodrun)")(
          "ssh-identity-file,i", po::value(&ssh_identity),
          "--launcher ssh: the private key to log in with (horovodrun)")(
          "ssh-option", po::value(&ssh_options)->composing(),
          "--launcher ssh: an ssh -o OPTION (repeatable)")(
          "agent-path", po::value(&agent_path),
          "--launcher ssh: caf-hvd on the hosts (default: this binary's path)")(
          "ssh-command", po::value(&ssh_command)->default_value("ssh"),
          "--launcher ssh: the ssh client to run")("srun-command",
                                                   po::value(&srun_command)->default_value("srun"),
                                                   "--launcher slurm: the srun to run");
    if (with_hosts)
      hosts_opts.add_options()("cluster-dir", po::value(&cluster),
                               "the cluster's credentials (see 'caf-hvd cluster init')")(
          "insecure", "talk to node agents without TLS (trusted networks only)")(
          "link-timeout", po::value(&link_timeout)->default_value(liveness::default_seconds),
          "seconds without a byte from a node agent before it counts as lost (hung or "
          "unreachable; an agent that dies is seen at once); agents started by --launcher "
          "get the same");
    output.add_options()(
        "output-filename", po::value(&output_dir),
        "also write each slot's output to DIR/HOST:LOCAL_RANK/{stdout,stderr}, with DIR/rank.N "
        "linking to the slot of rank N")("prefix-output-with-timestamp",
                                         "prefix every output line with the time it arrived")(
        "events", po::value(&events),
        "write the job's event log to FILE, one JSON object per line (default: "
        "$CAF_HVD_EVENTS)")("dashboard", po::value(&dashboard),
                            "[ADDR:]PORT: serve the job's live timeline page over HTTP "
                            "(loopback unless ADDR is given; PORT 0 picks one; the address is "
                            "printed at the start)")(
        "dashboard-keep", po::value(&dashboard_keep)->default_value(0),
        "seconds to keep serving the final page after the job ended (Ctrl-C ends it sooner)");
    net.add_options()("network-interface", po::value(&nics),
                      "NAME[,NAME...]: use only these interfaces between hosts");
    torch.add_options()(
        "torch-store", po::value(&torch_store)->default_value("auto"),
        "auto|on|off: serve torch's TCPStore at MASTER_PORT as torchrun does (auto: a client "
        "it cannot serve is reported; on: that also fails the job; off: MASTER_PORT is a free "
        "port for rank 0's own store)")("free-master-port", "the same as --torch-store off");
    if (with_hosts)
      elastic.add_options()("host-discovery-script", po::value(&discovery_script),
                            "executable printing the available hosts, one HOST, HOST:SLOTS or "
                            "HOST:PORT:SLOTS per line")("min-np", po::value(&min_np),
                                                        "fewest ranks to run with (default: -np)")(
          "max-np", po::value(&max_np), "most ranks to run with (default: all slots)")(
          "slots-per-host", po::value(&slots_per_host),
          "slots of a discovered host that prints no slot count")(
          "elastic-timeout", po::value(&elastic_timeout),
          "seconds to wait for --min-np slots, and for a rank that holds the job's state to "
          "re-join (default: $HOROVOD_ELASTIC_TIMEOUT or 600)")(
          "reset-limit", po::value(&reset_limit),
          "stop the job after this many resets (default: no limit)")(
          "blacklist-cooldown-range", po::value(&cooldown)->multitoken(),
          "LOW HIGH seconds; a failed host returns after LOW*2^failures+jitter, clamped to "
          "[LOW, HIGH] (default: never)")("discovery-interval",
                                          po::value(&discovery_interval)->default_value(1),
                                          "seconds between runs of the discovery script");
    gpu.add_options()("gpus-per-slot", po::value(&gpus_per_slot),
                      "GPUs each rank gets; ranks go only where that many are free, and each "
                      "node lends them to this job alone until its ranks there are gone")(
        "use-gpu", "= --gpus-per-slot 1")(
        "cuda-visible-devices", po::value(&cuda_visible)->default_value("shared"),
        "shared|per-rank: CUDA_VISIBLE_DEVICES of a rank is every device of the job on its node "
        "(local rank i uses the i-th group) or only its own")(
        "cpus-per-slot", po::value(&cpus_per_slot),
        "CPUs each rank may use: sets OMP_NUM_THREADS unless you set it");
    if (!with_hosts)
      gpu.add_options()("gpus", po::value(&local_gpus),
                        "LIST|none: this machine's GPUs (default: detected when a job asks "
                        "for GPUs)");
    exec.add_options()("executor-fd", po::value(&executor_fd),
                       "FD is a connected socket to the executor's owner: ranks get frame "
                       "channels, calls come from FD (README: Executor frames)")(
        "executor-max-frame-mb", po::value(&max_frame_mb)->default_value(256),
        "largest frame payload in MiB, either direction");
    compat.add_options()("num-proc", po::value(&np), "= -np (horovodrun)")(
        "network-interfaces", po::value(&nics), "= --network-interface (horovodrun)")(
        "gloo-timeout-seconds", po::value(&gloo_timeout),
        "sets HOROVOD_GLOO_TIMEOUT_SECONDS for the ranks (horovodrun)")(
        "log-level", po::value(&log_level),
        "TRACE|DEBUG|INFO|WARNING|ERROR|FATAL: HOROVOD_LOG_LEVEL for the ranks; TRACE and "
        "DEBUG also turn on --verbose (horovodrun)")("timeline-filename", po::value(&timeline),
                                                     "sets HOROVOD_TIMELINE (horovodrun)")(
        "autotune", "sets HOROVOD_AUTOTUNE=1 (horovodrun)")(
        "fusion-threshold-mb", po::value(&fusion_threshold_mb),
        "sets HOROVOD_FUSION_THRESHOLD (horovodrun)")("cycle-time-ms", po::value(&cycle_time_ms),
                                                      "sets HOROVOD_CYCLE_TIME (horovodrun)")(
        "cache-capacity", po::value(&cache_capacity),
        "sets HOROVOD_CACHE_CAPACITY (horovodrun)")("gloo", "accepted: Gloo is the controller")(
        "disable-cache", "accepted: caf-hvd caches nothing between jobs")(
        "mpi", "not supported: Gloo only")("jsrun", "not supported: Gloo only");
    if (!with_hosts)
      compat.add_options()("ssh-port,p", po::value(&ssh_port),
                           "not for run (this machine only): caf-hvd driver --launcher ssh")(
          "ssh-identity-file,i", po::value(&ssh_identity),
          "not for run (this machine only): caf-hvd driver --launcher ssh");
    if (!with_hosts)
      compat.add_options()("nproc-per-node", po::value(&np), "= -np (torchrun)")(
          "nproc_per_node", po::value(&np), "= -np (torchrun)");
    hidden.add_options()("command", po::value(&command)->composing(), "the command to run");
    visible.add(job).add(hosts_opts);
    if (with_hosts)
      visible.add(elastic);
    visible.add(output).add(net).add(torch).add(gpu).add(exec).add(compat);
    desc.add(visible).add(hidden);
  }
  void print_help(std::ostream& os, const std::string& title) const {
    os << title << "\n" << visible << "\n";
  }
};

// Validates the elastic flags (horovodrun's names and rules, with clearer errors).
// -np, or one of its horovodrun/torchrun spellings.
bool np_given(const po::variables_map& vm) {
  for (auto name : {"np", "num-proc", "nproc-per-node", "nproc_per_node"})
    if (vm.count(name))
      return true;
  return false;
}

elastic_config elastic_options(const job_options& o, const po::variables_map& vm) {
  elastic_config ec;
  if (!o.hosts.empty() || !o.hostfile.empty())
    throw usage_error("--host-discovery-script replaces -H/--hostfile: list the hosts from the "
                      "script");
  ec.discovery_script = o.discovery_script;
  ec.shim = shim_path();
  struct stat st {};
  if (::stat(ec.discovery_script.c_str(), &st) != 0)
    throw usage_error(
        fmt::format("--host-discovery-script {}: {}", ec.discovery_script, std::strerror(errno)));
  if (!S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0
      || ::access(ec.discovery_script.c_str(), X_OK) != 0)
    throw usage_error(fmt::format("--host-discovery-script {}: not an executable file (chmod +x "
                                  "it, and start it with #!/bin/sh or similar)",
                                  ec.discovery_script));
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

// `caf-hvd run -H localhost:4` or a hostfile: every host must be this machine; the
// ranks are at most (and by default) the slots given.
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

// The hosts that get ranks, as the launchers see them.
std::vector<launch_target> launch_targets(const job_config& job) {
  std::vector<launch_target> targets;
  for (size_t i = 0; i < job.addresses.size(); ++i)
    targets.push_back({job.hosts[i].host, job.addresses[i], job.hosts[i].port});
  return targets;
}

// The agents' ports, as the launcher found them.
void take_ports(const std::vector<launch_target>& targets, job_config& job) {
  for (size_t i = 0; i < targets.size(); ++i)
    job.hosts[i].port = targets[i].port;
}

int run_job(int argc, char** argv, bool embedded) {
  auto title = embedded ? std::string{"caf-hvd run: run a whole job on this machine.\n\n"
                                      "usage: caf-hvd run -np N [options] [--] COMMAND [ARGS...]\n"
                                      "The command starts at the first argument that is not an "
                                      "option; everything after it is the program's.\n"}
                        : std::string{"caf-hvd driver: run a job across node agents.\n\n"
                                      "usage: caf-hvd driver -np N (-H SPEC,... | --hostfile FILE) "
                                      "[options] [--] COMMAND [ARGS...]\n"
                                      "       caf-hvd driver --host-discovery-script PATH "
                                      "[--min-np N] [--max-np N] [options] [--] COMMAND\n"};
  job_options o{"options", !embedded};
  auto [args, cmd] = split_command(argc, argv, o.desc);
  if (std::find(args.begin(), args.end(), "--help") != args.end()
      || std::find(args.begin(), args.end(), "-h") != args.end()) {
    o.print_help(std::cout, title);
    return 0;
  }
  po::positional_options_description pos;
  pos.add("command", -1);
  auto vm = parse(args, o.desc, &pos);
  o.command.insert(o.command.end(), cmd.begin(), cmd.end());

  job_config job;
  job.embedded = embedded;
  job.verbose = vm.count("verbose") > 0;
  job.quiet = vm.count("quiet") > 0;
  if (o.torch_store == "auto")
    job.torch_store = torch_store_mode::automatic;
  else if (o.torch_store == "on")
    job.torch_store = torch_store_mode::on;
  else if (o.torch_store == "off")
    job.torch_store = torch_store_mode::off;
  else
    throw usage_error(fmt::format("--torch-store '{}': expected auto, on or off", o.torch_store));
  if (vm.count("free-master-port")) {
    if (!vm["torch-store"].defaulted() && job.torch_store != torch_store_mode::off)
      throw usage_error("--free-master-port means --torch-store off; give only one of them");
    job.torch_store = torch_store_mode::off;
  }
  if (o.command.empty())
    throw usage_error("no command given, e.g. caf-hvd run -np 2 hostname");
  if (o.launcher != "none" && o.launcher != "ssh" && o.launcher != "slurm")
    throw usage_error(fmt::format("--launcher '{}': expected none, ssh or slurm", o.launcher));
  if (o.launcher == "slurm" && (!o.hosts.empty() || !o.hostfile.empty()))
    throw usage_error("--launcher slurm takes the hosts of the Slurm allocation it runs in; "
                      "leave out -H/--hostfile");
  if (o.launcher == "slurm" && vm.count("host-discovery-script"))
    throw usage_error("--launcher slurm starts agents for the allocation's hosts; an elastic "
                      "job's hosts need running agents");
  for (auto flag : {"ssh-port", "ssh-identity-file"})
    if (embedded && vm.count(flag))
      throw usage_error(fmt::format("--{} is not supported by caf-hvd run, which runs on this "
                                    "machine only; caf-hvd driver --launcher ssh starts node "
                                    "agents over ssh (or start `caf-hvd node` on each host)",
                                    flag));
  for (auto flag : {"ssh-port", "ssh-identity-file", "ssh-option", "agent-path"})
    if (vm.count(flag) && o.launcher != "ssh")
      throw usage_error(fmt::format("--{} belongs to --launcher ssh (caf-hvd starts no agents "
                                    "otherwise: start `caf-hvd node` on each host)",
                                    flag));
  if (o.launcher == "ssh" && vm.count("host-discovery-script"))
    throw usage_error("--launcher ssh starts agents for a fixed host list; an elastic job's "
                      "hosts need running agents");
  for (auto flag : {"mpi", "jsrun"})
    if (vm.count(flag))
      throw usage_error(fmt::format("--{} is not supported: caf-hvd runs Gloo jobs only", flag));
  // horovodrun's tunables are environment variables of the ranks
  auto horovod_env = [&](const char* key, const std::string& value) {
    o.env.push_back(fmt::format("{}={}", key, value));
  };
  if (vm.count("gloo-timeout-seconds")) {
    if (o.gloo_timeout < 1)
      throw usage_error("--gloo-timeout-seconds must be at least 1");
    horovod_env("HOROVOD_GLOO_TIMEOUT_SECONDS", std::to_string(o.gloo_timeout));
  }
  if (vm.count("log-level")) {
    static const std::vector<std::string> levels{"TRACE",   "DEBUG", "INFO",
                                                 "WARNING", "ERROR", "FATAL"};
    std::string level = o.log_level;
    std::transform(level.begin(), level.end(), level.begin(), ::toupper);
    if (std::find(levels.begin(), levels.end(), level) == levels.end())
      throw usage_error(fmt::format("--log-level '{}': expected one of TRACE, DEBUG, INFO, "
                                    "WARNING, ERROR, FATAL",
                                    o.log_level));
    horovod_env("HOROVOD_LOG_LEVEL", level);
    if (level == "TRACE" || level == "DEBUG")
      job.verbose = true;
  }
  if (vm.count("timeline-filename"))
    horovod_env("HOROVOD_TIMELINE", o.timeline);
  if (vm.count("autotune"))
    horovod_env("HOROVOD_AUTOTUNE", "1");
  if (vm.count("fusion-threshold-mb")) {
    if (!(o.fusion_threshold_mb >= 0))
      throw usage_error("--fusion-threshold-mb must not be negative");
    horovod_env("HOROVOD_FUSION_THRESHOLD",
                std::to_string(static_cast<long long>(o.fusion_threshold_mb * 1024 * 1024)));
  }
  if (vm.count("cycle-time-ms"))
    horovod_env("HOROVOD_CYCLE_TIME", std::to_string(o.cycle_time_ms));
  if (vm.count("cache-capacity"))
    horovod_env("HOROVOD_CACHE_CAPACITY", std::to_string(o.cache_capacity));
  job.prefix_timestamp = vm.count("prefix-output-with-timestamp") > 0;
  if (!vm.count("events"))
    if (const char* e = std::getenv("CAF_HVD_EVENTS"); e && *e)
      o.events = e;
  if (!o.events.empty()) {
    // Fails here, before anything starts, when the file cannot be written.
    int fd = ::open(o.events.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      throw usage_error(
          fmt::format("--events {}: cannot write it: {}", o.events, std::strerror(errno)));
    ::close(fd);
    job.events_file = o.events;
  }
  if (!(o.dashboard_keep >= 0 && o.dashboard_keep <= 86400))
    throw usage_error("--dashboard-keep: give seconds from 0 to 86400");
  if (vm.count("dashboard-keep") && !vm["dashboard-keep"].defaulted() && o.dashboard.empty())
    throw usage_error("--dashboard-keep needs --dashboard");
  if (!o.dashboard.empty()) {
    try {
      parse_dashboard_address(o.dashboard);
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  }
  if (vm.count("executor-fd")) {
    struct stat st {};
    if (o.executor_fd < 0 || ::fstat(o.executor_fd, &st) != 0)
      throw usage_error(fmt::format("--executor-fd {}: not an open descriptor", o.executor_fd));
    if (!S_ISSOCK(st.st_mode))
      throw usage_error(fmt::format("--executor-fd {}: not a socket (the owner passes one end of a "
                                    "socketpair)",
                                    o.executor_fd));
    ::fcntl(o.executor_fd, F_SETFD, FD_CLOEXEC); // no child inherits the owner's channel
    job.executor_fd = o.executor_fd;
  }
  if (vm.count("use-gpu")) {
    if (vm.count("gpus-per-slot") && o.gpus_per_slot != 1)
      throw usage_error("--use-gpu means --gpus-per-slot 1; give only one of them");
    o.gpus_per_slot = 1;
  }
  if (o.gpus_per_slot < 0 || o.gpus_per_slot > 64)
    throw usage_error(fmt::format("--gpus-per-slot {}: expected 0 to 64", o.gpus_per_slot));
  if (o.cpus_per_slot < 0 || (vm.count("cpus-per-slot") && o.cpus_per_slot == 0))
    throw usage_error(fmt::format("--cpus-per-slot {}: expected at least 1", o.cpus_per_slot));
  if (o.cuda_visible != "shared" && o.cuda_visible != "per-rank")
    throw usage_error(
        fmt::format("--cuda-visible-devices '{}': expected shared or per-rank", o.cuda_visible));
  job.gpus_per_slot = static_cast<uint32_t>(o.gpus_per_slot);
  job.cpus_per_slot = static_cast<uint32_t>(o.cpus_per_slot);
  job.cuda_per_rank = o.cuda_visible == "per-rank";
  std::optional<gpu_inventory> local_inventory;
  if (embedded && vm.count("gpus")) {
    try {
      local_inventory = gpu_inventory{parse_gpu_list(o.local_gpus), "--gpus"};
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  } else if (embedded && job.gpus_per_slot > 0) {
    local_inventory = detect_gpus();
  }
  if (!(o.max_frame_mb > 0 && o.max_frame_mb <= 4095))
    throw usage_error("--executor-max-frame-mb must be between 0 and 4095");
  job.max_frame = static_cast<uint64_t>(o.max_frame_mb * 1024 * 1024);
  bool elastic = vm.count("host-discovery-script") > 0;
  for (auto flag : {"min-np", "max-np", "slots-per-host", "elastic-timeout", "reset-limit",
                    "blacklist-cooldown-range"})
    if (!elastic && vm.count(flag))
      throw usage_error(fmt::format("--{} belongs to elastic jobs: give --host-discovery-script "
                                    "too",
                                    flag));
  // Inside a batch allocation and without -H/--hostfile, the allocation gives the hosts.
  std::optional<allocation> alloc;
  if (!embedded && !elastic && o.hosts.empty() && o.hostfile.empty()) {
    try {
      alloc = detect_allocation();
    } catch (const spec_error& e) {
      throw usage_error(e.what());
    }
  }
  if (o.launcher == "slurm" && (!alloc || alloc->source.rfind("Slurm", 0) != 0))
    throw usage_error("--launcher slurm runs inside a Slurm allocation (salloc, sbatch): "
                      "SLURM_JOB_ID is not set");
  if (!elastic && !np_given(vm) && !alloc
      && !(embedded && (!o.hosts.empty() || !o.hostfile.empty())))
    throw usage_error("-np is required: the number of ranks");
  if (np_given(vm) && o.np < 1)
    throw usage_error(fmt::format("-np {}: need at least 1 rank", o.np));
  if (!(o.start_timeout > 0))
    throw usage_error("--start-timeout must be a positive number of seconds");
  if (!(o.kill_grace >= 0))
    throw usage_error("--kill-grace-seconds must not be negative");
  try {
    liveness::from_seconds(o.link_timeout);
  } catch (const std::exception& e) {
    throw usage_error(e.what());
  }
  for (auto& kv : o.env) {
    try {
      parse_env_assignment(kv);
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  }
  if (embedded) {
    if (!o.hosts.empty() || !o.hostfile.empty())
      o.np = local_slots(o, np_given(vm) ? std::optional<int>{o.np} : std::nullopt);
    job.hosts = {host_spec{"localhost", 0, static_cast<uint32_t>(o.np)}};
  } else if (elastic) {
    job.elastic = elastic_options(o, vm);
    o.np = job.elastic->min_np;
  } else {
    if (!o.hosts.empty() && !o.hostfile.empty())
      throw usage_error("give the hosts with exactly one of -H/--hosts or --hostfile");
    if (o.hosts.empty() && o.hostfile.empty() && !alloc)
      throw usage_error("give the hosts with -H/--hosts or --hostfile (or run inside a Slurm, "
                        "PBS or LSF allocation)");
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
  job.np = o.np;
  job.command = o.command;
  job.extra_env = o.env;
  job.base_env = forwardable_environment(environ);
  char cwd[4096];
  job.cwd = getcwd(cwd, sizeof(cwd)) ? cwd : "/";
  job.start_timeout = std::chrono::milliseconds(static_cast<long>(o.start_timeout * 1000));
  job.kill_grace = std::chrono::milliseconds(static_cast<long>(o.kill_grace * 1000));
  job.output_dir = o.output_dir;
  if (vm.count("network-interface")) {
    std::string_view rest = o.nics;
    while (true) {
      auto comma = rest.find(',');
      auto name = rest.substr(0, comma);
      if (name.empty() || name.size() > 15)
        throw usage_error(fmt::format("--network-interface '{}': expected NAME[,NAME...] with "
                                      "interface names of 1 to 15 characters",
                                      o.nics));
      job.network_interfaces.emplace_back(name);
      if (comma == std::string_view::npos)
        break;
      rest = rest.substr(comma + 1);
    }
  }
  if (!job.output_dir.empty())
    prepare_output_dir(job.output_dir);

  std::optional<cluster_credentials> creds;
  if (!embedded) {
    creds = credentials_for(vm, o.cluster, cert_role::driver);
    job.tls = creds.has_value();
  }
  launcher_config launcher;
  launcher.kind = o.launcher;
  launcher.ssh_command = o.ssh_command;
  launcher.ssh_port = o.ssh_port;
  launcher.ssh_identity = o.ssh_identity;
  launcher.ssh_extra = o.ssh_options;
  launcher.agent_path = o.agent_path;
  launcher.srun_command = o.srun_command;
  launcher.link_timeout = o.link_timeout;
  std::unique_ptr<srun_agents> step;
  if (o.launcher == "slurm") {
    block_termination_signals(); // before the step's reader thread exists (see below)
    auto so = launcher_options(launcher, creds ? creds->dir : std::string{}, shim_path(),
                               job.start_timeout);
    auto targets = launch_targets(job);
    if (auto error = start_agents_over_srun(so, targets, step); !error.empty()) {
      std::cerr << fmt::format("caf-hvd: error: cannot start node agents with {}: {}\n",
                               o.srun_command, error);
      step.reset();
      return 1;
    }
    take_ports(targets, job);
  }
  std::unique_ptr<ssh_agents> agents;
  if (o.launcher == "ssh") {
    // before the sessions' reader threads exist: they inherit the mask, and a SIGINT
    // that one of them took would end the driver without stopping anything
    block_termination_signals();
    auto so = launcher_options(launcher, creds ? creds->dir : std::string{}, shim_path(),
                               job.start_timeout);
    auto targets = launch_targets(job);
    if (auto report = start_agents_over_ssh(so, targets, agents); !report.empty()) {
      std::cerr << "caf-hvd: error: cannot start node agents over ssh:" << report << "\n";
      agents.reset();
      return 1;
    }
    take_ports(targets, job);
  }
  if (!embedded && !elastic) {
    // Every node agent must accept TCP before CAF connects (see check_tcp_reachable).
    std::vector<std::pair<std::string, uint16_t>> endpoints;
    for (size_t i = 0; i < job.addresses.size(); ++i)
      endpoints.emplace_back(job.addresses[i], job.hosts[i].port);
    auto problems = check_tcp_reachable(endpoints, job.start_timeout);
    std::string report;
    for (size_t i = 0; i < problems.size(); ++i)
      if (!problems[i].empty())
        report += fmt::format("\n  node agent {}{}: {}", job.hosts[i].endpoint(),
                              job.addresses[i] == job.hosts[i].host
                                  ? std::string{}
                                  : fmt::format(" ({})", job.addresses[i]),
                              problems[i] == std::strerror(ECONNREFUSED)
                                  ? problems[i] + " (is `caf-hvd node` running there?)"
                                  : problems[i]);
    if (!report.empty()) {
      std::cerr << "caf-hvd: error: cannot reach every node agent:" << report << "\n";
      return 1;
    }
  }

  // The live view listens before anything starts, so a port in use fails the job early;
  // its thread starts with the termination signals blocked (they go to the signal
  // thread below, never to a thread that would die of them).
  block_termination_signals();
  std::unique_ptr<dashboard> live;
  if (!o.dashboard.empty()) {
    auto [addr, port] = parse_dashboard_address(o.dashboard);
    try {
      live = std::make_unique<dashboard>(dashboard_options{
          addr, port, fmt::format("caf-hvd job: {}", fmt::join(job.command, " ")), 2});
    } catch (const std::exception& e) {
      std::cerr << fmt::format("caf-hvd: error: --dashboard {}: {}\n", o.dashboard, e.what());
      return 1;
    }
    if (!dashboard_is_loopback(addr))
      std::cerr << fmt::format(
          "caf-hvd: WARNING: the dashboard on {}:{} is plain HTTP without authentication: "
          "anyone who can reach that address sees this job's hosts, command and events\n",
          addr, live->port());
    std::cerr << fmt::format("caf-hvd: dashboard at http://{}:{}/\n",
                             addr.find(':') != std::string::npos ? "[" + addr + "]" : addr,
                             live->port());
    job.event_observer = [d = live.get()](const nlohmann::json& e) { d->add(e); };
  }

  block_termination_signals();
  hvd_config cfg;
  if (embedded) {
    cfg.node->name = this_hostname();
    cfg.node->shim = shim_path();
    if (local_inventory) {
      cfg.node->gpus = std::make_shared<gpu_pool>(local_inventory->devices);
      cfg.node->gpu_source = local_inventory->source;
    }
  } else {
    cfg.enable_network(liveness::from_seconds(o.link_timeout), creds ? &*creds : nullptr);
  }
  caf::actor_system sys{cfg};
  if (embedded)
    cfg.node->guardian = spawn_guardian(sys);
  auto result = std::make_shared<job_result>();
  auto driver = spawn_driver(sys, std::move(job), result);
  // The signal thread forwards SIGINT/SIGTERM/SIGHUP to the driver; SIGUSR2 (blocked
  // like the others) wakes it when the job is over.
  std::thread signals{[driver] {
    auto set = termination_signals();
    sigaddset(&set, SIGUSR2);
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0)
        continue;
      if (sig == SIGUSR2)
        return;
      caf::anon_send(driver, interrupt_atom::value, static_cast<int32_t>(sig));
    }
  }};
  {
    caf::scoped_actor self{sys};
    self->monitor(driver);
    self->receive([](caf::down_msg&) {});
  }
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
  flush_output(); // every line the ranks wrote, however slowly stdout drains
  if (live && o.dashboard_keep > 0) {
    std::cerr << fmt::format("caf-hvd: the dashboard keeps the final page for {} s (Ctrl-C "
                             "ends it sooner)\n",
                             o.dashboard_keep);
    auto set = termination_signals();
    timespec ts{static_cast<time_t>(o.dashboard_keep),
                static_cast<long>((o.dashboard_keep - std::floor(o.dashboard_keep)) * 1e9)};
    sigtimedwait(&set, nullptr, &ts);
  }
  agents.reset(); // agents started for this job end with their ssh sessions
  step.reset();   // ... or with their srun step
  exit_watchdog(result->exit_code);
  if (cfg.node->guardian)
    caf::anon_send(cfg.node->guardian, shutdown_atom::value);
  return result->exit_code;
}

// caf-hvd hosts: the hosts a job would use, one HOST:SLOTS line each.
int run_hosts(int argc, char** argv) {
  po::options_description desc{"caf-hvd hosts: print the hosts a job would use, one HOST:SLOTS "
                               "line each (HOST:PORT:SLOTS when the port is not the default).\n\n"
                               "usage: caf-hvd hosts [-H SPEC,... | --hostfile FILE]\n"
                               "  without either: the allocation this runs in (Slurm, PBS, "
                               "LSF)\n\noptions"};
  std::string hosts, hostfile;
  desc.add_options()("help,h", "show this help")("hosts,H", po::value(&hosts),
                                                 "HOST:SLOTS or HOST:PORT:SLOTS, comma-separated")(
      "hostfile", po::value(&hostfile), "file of 'HOST[:PORT] slots=N' lines");
  auto [args, rest] = split_command(argc, argv, desc);
  if (!rest.empty())
    throw usage_error("caf-hvd hosts takes no command");
  auto vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
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
    } else {
      throw usage_error("no hosts: give -H or --hostfile, or run inside a Slurm, PBS or LSF "
                        "allocation");
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

// caf-hvd timeline EVENTS -o OUT: draws an event log (--events) as a page or a trace.
int run_timeline(int argc, char** argv) {
  po::options_description desc{"caf-hvd timeline: draw a job's event log.\n\n"
                               "usage: caf-hvd timeline EVENTS -o OUT.html|OUT.json\n\noptions"};
  std::string in, out, title;
  desc.add_options()("help,h", "show this help")(
      "output,o", po::value(&out),
      "OUT.html: a self-contained page with SVG lanes; OUT.json: Chrome trace-event JSON "
      "(Perfetto, chrome://tracing)")("title", po::value(&title), "the page's title");
  po::options_description hidden;
  hidden.add_options()("events", po::value(&in), "the event log");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("events", 1);
  std::vector<std::string> args(argv + 2, argv + argc);
  auto vm = parse(args, all, &pos);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (in.empty() || out.empty())
    throw usage_error("give the event log and -o OUT.html or -o OUT.json");
  bool html = out.size() > 5 && out.substr(out.size() - 5) == ".html";
  bool trace = out.size() > 5 && out.substr(out.size() - 5) == ".json";
  if (!html && !trace)
    throw usage_error(fmt::format("-o {}: name a .html (page) or .json (trace) file", out));
  std::ifstream f{in};
  if (!f)
    throw usage_error(fmt::format("cannot read the event log {}", in));
  auto events = read_events(f, in);
  std::ofstream o{out};
  if (!o)
    throw usage_error(fmt::format("-o {}: cannot write it", out));
  if (html)
    o << timeline_html(events, title.empty() ? "caf-hvd job " + in : title);
  else
    o << timeline_trace(events).dump() << "\n";
  if (!o.flush())
    throw std::runtime_error(fmt::format("writing {} failed", out));
  return 0;
}

void print_usage(std::ostream& os) {
  os << "caf-hvd " << version << ": a distributed training job launcher (Horovod-compatible)\n\n"
     << "usage:\n"
     << "  caf-hvd run -np N [options] -- COMMAND [ARGS...]     a job on this machine\n"
     << "  caf-hvd driver -np N -H HOST:SLOTS,... [options] -- COMMAND [ARGS...]\n"
     << "  caf-hvd driver --host-discovery-script PATH --min-np N [options] -- COMMAND\n"
     << "  caf-hvd node [--port PORT] [--name NAME] [--slots N] [--bind ADDR]\n"
     << "  caf-hvd cluster init|add-node|add-driver|revoke ... a cluster's credentials\n"
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
      std::cout << "caf-hvd " << version << " (CAF 0.17.6)\n";
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
