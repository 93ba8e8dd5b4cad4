// What caf-hvd's subcommands share (see cli.hpp).
#include "apps/cli.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/network/net.hpp"
#include "runtime/launch/process.hpp"

namespace cafhvd::cli {

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

#ifndef CAF_HVD_NODE_DEFAULTS
#define CAF_HVD_NODE_DEFAULTS "/etc/default/caf-hvd-node"
#endif

namespace {

// KEY=VALUE lines of an environment file as systemd's EnvironmentFile= reads them
// (comments, blank lines and surrounding quotes aside).
std::map<std::string, std::string> read_env_file(const std::string& path) {
  std::map<std::string, std::string> out;
  std::ifstream in{path};
  for (std::string line; std::getline(in, line);) {
    auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#')
      continue;
    auto eq = line.find('=', first);
    if (eq == std::string::npos)
      continue;
    auto key = line.substr(first, eq - first);
    auto value = line.substr(eq + 1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t' || value.back() == '\r'))
      value.pop_back();
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'')
        && value.back() == value.front())
      value = value.substr(1, value.size() - 2);
    out[key] = value;
  }
  return out;
}

} // namespace

cluster_choice default_cluster(const std::string& given) {
  if (!given.empty())
    return {given, "--cluster"};
  if (const char* env = std::getenv("CAF_HVD_CLUSTER"); env && *env)
    return {env, "$CAF_HVD_CLUSTER"};
  std::string path = CAF_HVD_NODE_DEFAULTS;
  if (const char* env = std::getenv("CAF_HVD_NODE_DEFAULTS"); env && *env)
    path = env;
  if (access(path.c_str(), R_OK) != 0)
    return {};
  auto conf = read_env_file(path);
  if (auto join = conf["CAF_HVD_NODE_JOIN"]; !join.empty())
    return {join, fmt::format("the installed agent's configuration {} (CAF_HVD_NODE_JOIN)", path)};
  auto bind = conf["CAF_HVD_NODE_BIND"];
  auto port = conf["CAF_HVD_NODE_PORT"];
  auto host = bind.empty() || bind == "0.0.0.0" ? std::string{"127.0.0.1"} : bind;
  return {port.empty() ? host : fmt::format("{}:{}", host, port),
          fmt::format("the installed agent's configuration {} (this host's agent, which "
                      "joins no other)",
                      path)};
}

void exit_watchdog(int code) {
  std::thread{[code] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }}.detach();
}

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
                        const po::positional_options_description* pos) {
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

std::optional<po::variables_map> parse_options_only(int argc, char** argv,
                                                    const po::options_description& desc,
                                                    const std::string& subcommand) {
  auto [args, rest] = split_command(argc, argv, desc);
  if (!rest.empty())
    throw usage_error(fmt::format("caf-hvd {} takes no command", subcommand));
  auto vm = parse(args, desc);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return std::nullopt;
  }
  return vm;
}

std::optional<cluster_credentials> credentials_for(const tls_choice& tls, cert_role role) {
  const char* who = to_string(role);
  if (tls.insecure) {
    if (tls.cluster_dir_given)
      throw usage_error("--insecure and --cluster-dir exclude each other");
    std::cerr << fmt::format(
        "caf-hvd {}: WARNING: --insecure: no TLS, no admission; anyone who can reach the "
        "node port can run commands there. Use only on a trusted network.\n",
        who);
    return std::nullopt;
  }
  const auto& dir = tls.cluster_dir;
  try {
    auto c = net::module().load_cluster(
        cluster_dir(dir.empty() ? std::nullopt : std::optional{dir}), role);
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

} // namespace cafhvd::cli
