// The cluster's membership on the agents' side: the table actor every agent publishes on
// its port (the one others join holds the table), and the joiner of an agent started with
// `--join HOST[:PORT]`, which joins, reports its node once a second when something
// changed (else every five), and joins again whenever the table's holder comes back.
#pragma once

#include <cstdint>
#include <string>

#include <caf/all.hpp>

#include "actors/protocol.hpp"

namespace cafhvd {

/// This agent as a member: name, address, slots, GPUs, labels, its jobs now.
member_info local_member(caf::actor_system& sys, const std::string& address);

/// The table actor of this agent. `join_target` ("HOST:PORT", empty: none) is where this
/// agent joined: such an agent holds no table and redirects `table` requests there.
cluster_actor spawn_cluster_table(caf::actor_system& sys, const std::string& join_target);

/// Joins the cluster whose table is at host:port and stays joined (see above). The first
/// join's definite refusals (another cluster, not a caf-hvd agent, a certificate of
/// another name, a name held by a live agent past the link timeout) go to the node
/// settings' `fatal`. Sending it (left_atom, stop_token) tells the table that the agent
/// stops (the token, the caller's secret, keeps peers from sending it).
caf::actor spawn_joiner(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls,
                        uint64_t stop_token);

} // namespace cafhvd
