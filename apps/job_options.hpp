// The options of `caf-hvd run` and `caf-hvd driver` and what they become: a validated
// job_config plus how to start it (a job_request). job_options.cpp holds the options and
// their checks, job_hosts.cpp where the job's hosts come from.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "actors/config.hpp"
#include "actors/driver.hpp"
#include "apps/cli.hpp"
#include "runtime/job/allocation.hpp"
#include "runtime/cluster/gpu.hpp"
#include "runtime/cluster/membership.hpp"
#include "runtime/launch/ssh_launch.hpp"

namespace cafhvd::cli {

/// What `caf-hvd run` or `caf-hvd driver` was asked, validated: the job and what the
/// starter (cmd_job.cpp) needs besides.
struct job_request {
  job_config job;                          // job.embedded: `caf-hvd run`
  bool elastic = false;                    // --host-discovery-script
  std::optional<gpu_inventory> local_gpus; // run: this machine's GPUs (--gpus, detected)
  tls_choice tls;                          // driver: --insecure, --cluster-dir
  launcher_config launcher;                // driver: --launcher and its options
  double link_timeout = liveness::default_seconds;
  std::string dashboard;                    // [ADDR:]PORT, "" = none
  std::vector<std::string> dashboard_names; // Host names it answers besides addresses
  double dashboard_keep = 0;
  // driver --cluster: no host list; the cluster's table places the ranks
  std::optional<cluster_address> cluster;
  placement_request place;
  double slot_wait = 60;
};

/// Parses the options of `caf-hvd run` (embedded) or `caf-hvd driver`; nullopt after
/// printing --help. Throws usage_error for a mistake, before anything starts.
std::optional<job_request> parse_job_options(int argc, char** argv, bool embedded);

/// The options as boost::program_options declares them, and the variables they fill.
struct job_options {
  po::options_description desc;    // everything the parser knows
  po::options_description visible; // what --help shows
  int np = 0;
  double start_timeout = 30, kill_grace = 5, link_timeout = liveness::default_seconds;
  std::string output_dir, hosts, hostfile, nics, cluster, torch_store = "auto";
  // the cluster's table places the ranks (no host list)
  std::string cluster_at, placement = "pack";
  std::vector<std::string> node_labels;
  double slot_wait = 60;
  std::vector<std::string> env;
  std::vector<std::string> command;
  // horovodrun's knobs are read from the parsed options (knob_flags in job_options.cpp)
  std::string config_file; // --config-file: horovodrun's YAML
  std::string events, dashboard;
  std::vector<std::string> dashboard_names;
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

  job_options(const std::string& title, bool with_hosts);
  void print_help(std::ostream& os, const std::string& title) const {
    os << title << "\n" << visible << "\n";
  }
};

// -- where the job's hosts come from (job_hosts.cpp) --------------------------------

/// -np, or one of its horovodrun/torchrun spellings.
bool np_given(const po::variables_map& vm);

/// Validates the elastic flags (horovodrun's names and rules, with clearer errors).
/// `from_cluster`: the hosts come from the cluster's table, not a script.
elastic_config elastic_options(const job_options& o, const po::variables_map& vm,
                               bool from_cluster = false);

/// `caf-hvd run -H localhost:4` or a hostfile: every host must be this machine; the
/// ranks are at most (and by default) the slots given.
int local_slots(const job_options& o, std::optional<int> np);

/// A static driver's hosts (the allocation's, -H's or the hostfile's) into job.hosts,
/// -np into o.np when the allocation decides it, and the address of every host that
/// gets ranks into job.addresses (--launcher slurm: the address Slurm knows).
void static_hosts(job_options& o, const po::variables_map& vm,
                  const std::optional<allocation>& alloc, job_config& job);

} // namespace cafhvd::cli
