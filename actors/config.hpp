// The actor-system configuration shared by every caf-hvd process: message types and
// spawnable actors must be registered identically on both ends of the wire.
#pragma once

#include <chrono>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "runtime/cluster/credential_files.hpp"
#include "runtime/cluster/gpu.hpp"
#include "runtime/launch/identity.hpp"
#include "runtime/cluster/membership.hpp"

namespace cafhvd {

/// What node-side actors need to know about the agent that hosts them.
struct node_settings {
  std::string name;    // the node's identity in jobs
  uint32_t slots = 0;  // 0 = not limited
  std::string shim;    // path of caf-hvd-exec
  caf::actor guardian; // every colocator links to it; stopping it ends all jobs
  std::shared_ptr<gpu_pool> gpus = std::make_shared<gpu_pool>(); // lent per job
  std::string gpu_source = "none found";
  // The cluster's credentials (nullopt: --insecure): drivers' tickets are checked with them
  std::optional<cluster_credentials> creds;
  std::shared_ptr<node_book> jobs = std::make_shared<node_book>();
  // membership: what the agent reports of itself (actors/cluster.hpp)
  std::vector<std::string> labels;
  std::string bind;
  uint16_t port = 0;
  int64_t started_ms = 0;
  std::chrono::milliseconds link_timeout{10000};
  // A failure that must end the agent (a join its cluster refuses): says why, stops it
  std::function<void(const std::string&)> fatal;
  // Drained (by an administrator, or by itself on SIGTERM with --drain-grace): it takes
  // no new jobs, and reports so; its running ranks go on
  std::shared_ptr<std::atomic<bool>> draining = std::make_shared<std::atomic<bool>>(false);
  // Where an administrator's drain is kept across the agent's restarts (--state-dir;
  // empty: kept only while the agent runs)
  std::string state_dir;
  // Whose account ranks run as (runtime/launch/identity.hpp): with switch_users, the owner's
  // (each job's colocator resolves it, or refuses the job); else the agent's own
  rank_user_policy rank_policy;
  bool switch_users = false;
};

/// Liveness of the links between driver and node agents; both ends must send heartbeats
/// (CAF 0.17 has them off by default and drops idle peers that send none). A link is
/// dead after `timeout` without a byte from its peer. CAF checks that on its own timer
/// and does not allow for its own process having been paused (a loaded or stolen-from
/// VM, seen here at over 3 s), so the default is a margin above such pauses, not the
/// fastest detection: a peer that dies is seen at once anyway (its socket closes).
struct liveness {
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds timeout{10000};
  /// `--link-timeout SECONDS`: in [1, 3600]; heartbeats every timeout/6, at most 0.5 s.
  static liveness from_seconds(double seconds);
  static constexpr double default_seconds = 10;
};

class hvd_config : public caf::actor_system_config {
public:
  hvd_config();
  /// Applies heartbeat settings and loads the middleman; with credentials also CAF's
  /// OpenSSL module in mutual-TLS mode (peers must present a certificate of `creds`' CA).
  /// Loads the network module (runtime/network/net.hpp) or throws.
  void enable_network(const liveness& l, const cluster_credentials* creds);
  std::shared_ptr<node_settings> node = std::make_shared<node_settings>();
};

/// The node settings of the system an actor runs in.
const node_settings& settings_of(caf::actor_system& sys);

/// Spawns the guardian of a node: colocators enlist with it; on shutdown_atom (with an
/// optional reason) it asks each to stop its ranks as a driver would (SIGTERM, grace,
/// SIGKILL, exits reported as stopped by the agent) and quits when they are gone.
caf::actor spawn_guardian(caf::actor_system& sys);

} // namespace cafhvd
