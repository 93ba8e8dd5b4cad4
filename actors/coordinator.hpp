// The coordinator: one per job, beside the job actor, with the role Horovod's driver
// gives its Coordinator. It owns the job's rendezvous side:
//   servers        the rendezvous server (Horovod's HTTP protocol, rank_and_size,
//                  /elastic/update) and torch's store, and who may talk to them
//   registrations  each worker reports (slot, host) when it is spawned; a worker on
//                  another host than the one its slot was placed on is an error that
//                  names both, a worker that never reports one of the start timeout
//   assignments    a generation's ranks over its hosts: Horovod's get_host_assignments
//                  (runtime/job/assignment), local and cross ranks included
//   barrier        the votes of the processes a forming generation carries over
//                  (rank_and_size), their join deadlines, the release to the servers
//   notifications  Horovod workers' notification services (PUT /worker_addresses) and
//                  the HostsUpdatedRequest to rank 0 when a generation changes hosts
// The job decides (which hosts, when a generation forms, when it is released); the
// coordinator tells it what the ranks did. Messages: actors/protocol.hpp.
#pragma once

#include <chrono>

#include <caf/all.hpp>

#include "actors/driver.hpp"
#include "actors/protocol.hpp"

namespace cafhvd {

struct coordinator_config {
  bool elastic = false;
  torch_store_mode torch_store = torch_store_mode::automatic;
  std::chrono::milliseconds start_timeout{30000};    // fresh processes' join deadline,
                                                     // and the workers' reports
  std::chrono::milliseconds elastic_timeout{600000}; // state holders' join deadline
  bool verbose = false;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(); // logs
};

/// Spawns a job's coordinator; it reports to `job` and ends with an exit message.
coordinator_full_actor spawn_coordinator(caf::actor_system& sys, coordinator_config config,
                                         coordinator_client_actor job);

} // namespace cafhvd
