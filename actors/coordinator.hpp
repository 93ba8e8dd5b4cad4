// The coordinator: registers (hostname, node, rank) and computes every rank's local and
// cross values. The rendezvous server will live here too.
#pragma once

#include "actors/protocol.hpp"
#include "runtime/assignment.hpp"

namespace cafhvd {

struct coordinator_state {
  coordinator_state() = default; // not an aggregate: CAF would construct it from `self`
  rank_registry registry;
  static inline const char* name = "coordinator";
};

coordinator_actor::behavior_type
coordinator_fn(coordinator_actor::stateful_pointer<coordinator_state> self);

} // namespace cafhvd
