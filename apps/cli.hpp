// What caf-hvd's subcommands share: the usage error, the process's signal discipline,
// option parsing with boost::program_options, credentials, and the subcommands' entry
// points (one file each: cmd_node.cpp, cmd_job.cpp, cmd_hosts.cpp, cmd_timeline.cpp,
// cmd_cluster.cpp).
#pragma once

#include <csignal>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <boost/program_options.hpp>

#include "runtime/cluster/credential_files.hpp"

namespace cafhvd::cli {

namespace po = boost::program_options;

/// This release (`caf-hvd --version`, `-cb`).
constexpr const char* caf_hvd_version = "0.1.0";

/// A mistake on the command line: main prints it with a pointer to --help, exit code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The signals that end a process gracefully (SIGINT, SIGTERM, SIGHUP).
sigset_t termination_signals();

/// Blocks the termination signals (and SIGUSR2, which wakes the driver's signal thread)
/// in the calling thread and so in every thread it starts; ignores SIGPIPE. Called
/// before CAF starts its threads: the signals are taken with sigwait, so no handler
/// runs inside CAF.
void block_termination_signals();

/// This machine's hostname.
std::string this_hostname();

/// caf-hvd-exec next to this binary; throws std::runtime_error when it is not there.
std::string shim_path();

/// The job is decided; CAF's shutdown may still wait on a connection attempt blocked in
/// its OpenSSL module (a peer that never answers the handshake), which has no timeout.
/// Gives the actor system a few seconds to wind down, then leaves with `code`.
void exit_watchdog(int code);

/// Splits argv (after the subcommand) into caf-hvd's options and the command: the
/// command starts at "--" or at the first argument that is neither an option nor an
/// option's value, so `caf-hvd run -np 2 python3 train.py --lr 0.1` passes `--lr 0.1`
/// to the program.
std::pair<std::vector<std::string>, std::vector<std::string>>
split_command(int argc, char** argv, const po::options_description& desc);

/// Parses `args` against `desc` (long options may be written with one dash, no
/// abbreviations); a parser error becomes a usage_error.
po::variables_map parse(const std::vector<std::string>& args, const po::options_description& desc,
                        const po::positional_options_description* pos = nullptr);

/// A subcommand that takes options and no command: its options, or nullopt after
/// --help printed `desc`. A command after the options is a usage error.
std::optional<po::variables_map> parse_options_only(int argc, char** argv,
                                                    const po::options_description& desc,
                                                    const std::string& subcommand);

/// --insecure and --cluster-dir as given.
struct tls_choice {
  bool insecure = false;
  bool cluster_dir_given = false;
  std::string cluster_dir; // "" = $CAF_HVD_CLUSTER_DIR or the default directory
};

/// The credentials a node or driver uses, or nullopt with --insecure (after a warning).
std::optional<cluster_credentials> credentials_for(const tls_choice& tls, cert_role role);

// The subcommands, each returning the process's exit code; argv[1] is the subcommand.
/// Where the cluster is when a command needs one: `given` (--cluster), else
/// $CAF_HVD_CLUSTER, else the installed node agent's configuration
/// (/etc/default/caf-hvd-node, or the file $CAF_HVD_NODE_DEFAULTS names): the agent it
/// joins (CAF_HVD_NODE_JOIN), or the agent itself, which then holds the table
/// (CAF_HVD_NODE_BIND or 127.0.0.1, CAF_HVD_NODE_PORT). `address` is empty when none is
/// there; `source` says which one it was, for messages.
struct cluster_choice {
  std::string address;
  std::string source;
};
cluster_choice default_cluster(const std::string& given);

int run_node(int argc, char** argv);
int run_job(int argc, char** argv, bool embedded); // run (embedded) and driver
int run_cluster(int argc, char** argv);
int run_timeline(int argc, char** argv);
int run_hosts(int argc, char** argv);
int run_status(int argc, char** argv, bool jobs_only = false); // status, jobs
int run_drain(int argc, char** argv, bool drain); // drain, undrain
int run_cancel(int argc, char** argv);             // cancel JOB

} // namespace cafhvd::cli
