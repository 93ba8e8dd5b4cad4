// Rank placement and local/cross rank computation, exactly as Horovod defines them
// (get_host_assignments and the Ray Coordinator). Pure functions over plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cafhvd {

/// Horovod's SlotInfo: where one rank runs and its position in the three scopes.
struct slot_info {
  std::string hostname;
  int rank = -1;
  int local_rank = -1;
  int cross_rank = -1;
  int size = -1;
  int local_size = -1;
  int cross_size = -1;

  /// "rank,size,local_rank,local_size,cross_rank,cross_size" (Horovod's wire order).
  std::string to_response_string() const;
  friend bool operator==(const slot_info&, const slot_info&) = default;
};

/// A host name and how many slots it offers, in the order the user gave hosts.
struct host_slots {
  std::string hostname;
  int slots = 0;
};

/// Packs ranks onto hosts in the given order, contiguous per host. With max_np, hosts
/// after the cap get nothing. Throws std::invalid_argument when fewer than min_np slots
/// exist or a host name repeats.
std::vector<slot_info> get_host_assignments(const std::vector<host_slots>& hosts, int min_np,
                                            std::optional<int> max_np = std::nullopt);

/// Local and cross values of one rank.
struct local_cross {
  int local_rank = 0;
  int local_size = 0;
  int cross_rank = 0;
  int cross_size = 0;
  friend bool operator==(const local_cross&, const local_cross&) = default;
};

/// The coordinator's registry: ranks grouped by node in order of first appearance.
/// Grouping is by node identity, so two agents on one machine are two hosts.
class rank_registry {
public:
  /// Records that `rank` runs on `node` (reported hostname `hostname`). Throws
  /// std::invalid_argument on a rank registered twice.
  void add(const std::string& hostname, const std::string& node, int rank);

  int world_size() const;

  /// Horovod's "node:count,node:count" string, nodes in insertion order.
  std::string node_string() const;

  /// Per-rank values indexed by rank; throws if ranks are not 0..size-1.
  std::vector<local_cross> finalize() const;

  /// The plan as Horovod's SlotInfo list, one per rank in rank order; a node's hostname
  /// is the one its first rank reported.
  std::vector<slot_info> plan() const;

  /// Nodes in insertion order with their sorted ranks.
  const std::vector<std::pair<std::string, std::vector<int>>>& nodes() const { return nodes_; }

private:
  std::vector<std::pair<std::string, std::vector<int>>> nodes_;
  std::vector<std::string> hostnames_; // per node, parallel to nodes_
};

} // namespace cafhvd
