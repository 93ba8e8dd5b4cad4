// The coordinator: registers (hostname, node, rank) and computes every rank's local and
// cross values, and owns the job's rendezvous server.
#pragma once

#include "actors/protocol.hpp"
#include <memory>

#include "runtime/assignment.hpp"
#include "runtime/rendezvous_server.hpp"

namespace cafhvd {

struct coordinator_state {
  coordinator_state() = default; // not an aggregate: CAF would construct it from `self`
  rank_registry registry;
  std::unique_ptr<rendezvous_server> server; // stops with the coordinator
  static inline const char* name = "coordinator";
};

coordinator_actor::behavior_type
coordinator_fn(coordinator_actor::stateful_pointer<coordinator_state> self);

} // namespace cafhvd
