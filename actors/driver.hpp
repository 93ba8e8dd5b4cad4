// The driver: owns one job from placement to exit code, as a small number of explicit
// phases, each bounded by a deadline and able to say whom it is waiting for.
#pragma once

#include "runtime/cluster/credential_files.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/protocol.hpp"
#include "runtime/job/elastic.hpp"
#include "runtime/job/host_spec.hpp"

namespace cafhvd {

/// horovodrun's elastic flags (`caf-hvd driver --host-discovery-script ...`).
struct elastic_config {
  std::string discovery_script;
  std::string shim; // caf-hvd-exec, which runs the script in its own process group
  // Or the cluster's table (driver --cluster with --min-np/--max-np and no script): the
  // hosts are its live members with slots this job may use, asked every interval.
  std::optional<cluster_address> cluster;
  std::vector<std::string> cluster_labels; // --node-label
  int min_np = 1;
  std::optional<int> max_np;
  std::optional<uint32_t> slots_per_host;
  std::chrono::milliseconds elastic_timeout{600000};
  std::optional<int> reset_limit;
  std::optional<cooldown_range> cooldown;
  std::chrono::milliseconds discovery_interval{1000};
  std::chrono::milliseconds discovery_timeout{30000}; // one run of the script
  // A new host's ranks start when its plan forms and wait at their first rendezvous
  // while the others train (false: --cold-joins, at the release, as horovodrun does).
  bool warm_joins = true;
};

/// --torch-store: serve torch's TCPStore at MASTER_PORT, as torchrun's agent does
/// (automatic: a client the store cannot serve is reported; on: it also fails the job),
/// or leave MASTER_PORT to rank 0's own store (off).
enum class torch_store_mode { automatic, on, off };

/// Everything the user asked for, validated by the command line front end.
struct job_config {
  std::vector<host_spec> hosts;       // node agents in the order given
  std::vector<std::string> addresses; // resolved IPv4 address of each host
  bool embedded = false;              // `caf-hvd run`: one node inside this process
  std::string job_id;                 // "" = made at the start (placement made one before)
  int np = 1;
  std::vector<std::string> command;
  std::vector<std::string> base_env;  // forwarded from the driver's environment
  std::vector<std::string> extra_env; // --env KEY=VALUE
  std::string cwd;
  std::chrono::milliseconds start_timeout{30000};
  std::chrono::milliseconds kill_grace{5000};
  std::string output_dir;                      // --output-filename
  std::vector<std::string> network_interfaces; // --network-interface: the only candidates
  bool verbose = false;
  bool quiet = false;            // --quiet: no closing summary
  bool prefix_timestamp = false; // --prefix-output-with-timestamp
  std::string events_file;       // --events: the job's event log (JSON lines)
  // --dashboard: every event is also handed here (on the job actor's thread)
  std::function<void(const nlohmann::json&)> event_observer;
  bool tls = true; // connect to node agents through mutual TLS (false: --insecure)
  // the driver's credentials: it signs each colocator spawn with them (agents check)
  std::optional<cluster_credentials> creds;
  torch_store_mode torch_store = torch_store_mode::automatic;
  std::optional<elastic_config> elastic; // set: hosts come from discovery, not `hosts`
  // GPUs: devices per slot lent by each node for the job (0 = a CPU job); every rank of
  // a node sees all the job's devices there (shared) or only its own (per-rank)
  uint32_t gpus_per_slot = 0;
  bool cuda_per_rank = false;
  uint32_t cpus_per_slot = 0; // sets OMP_NUM_THREADS unless the user did
  // executor mode: the owner's channel (an inherited socket); ranks get channels too
  int executor_fd = -1;
  uint64_t max_frame = 256ull << 20; // largest payload of a frame, either direction
};

/// Filled in by the driver before it quits.
struct job_result {
  int exit_code = 1;
};

/// Spawns the job actor (actors/job.cpp) for `job`, static or elastic; the result is set
/// when it terminates.
driver_full_actor spawn_driver(caf::actor_system& sys, job_config job,
                               std::shared_ptr<job_result> result);

} // namespace cafhvd
