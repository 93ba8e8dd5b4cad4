// Implements Horovod's placement (get_host_assignments) and its Coordinator's
// local/cross rank rules; the unit tests replay Horovod's worked examples.
#include "runtime/job/assignment.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace cafhvd {

std::string slot_info::to_response_string() const {
  return fmt::format("{},{},{},{},{},{}", rank, size, local_rank, local_size, cross_rank,
                     cross_size);
}

std::vector<slot_info> get_host_assignments(const std::vector<host_slots>& hosts, int min_np,
                                            std::optional<int> max_np) {
  std::set<std::string> names;
  for (auto& h : hosts)
    if (!names.insert(h.hostname).second)
      throw std::invalid_argument(fmt::format("host '{}' appears twice", h.hostname));
  // cross[lr] lists, in host order, the hosts that have a rank with local rank lr.
  std::vector<std::vector<std::string>> cross;
  std::vector<std::pair<const host_slots*, std::vector<int>>> placed;
  int rank = 0;
  for (auto& h : hosts) {
    std::vector<int> ranks;
    for (int lr = 0; lr < h.slots; ++lr) {
      if (max_np && rank == *max_np)
        break;
      ranks.push_back(rank++);
      if (cross.size() <= static_cast<size_t>(lr))
        cross.resize(lr + 1);
      cross[lr].push_back(h.hostname);
    }
    placed.emplace_back(&h, std::move(ranks));
  }
  int size = rank;
  if (size < min_np)
    throw std::invalid_argument(
        fmt::format("requested {} processes but the hosts offer only {} slots", min_np, size));
  std::vector<slot_info> out;
  out.reserve(size);
  for (auto& [h, ranks] : placed) {
    for (size_t lr = 0; lr < ranks.size(); ++lr) {
      auto& peers = cross[lr];
      auto pos = std::find(peers.begin(), peers.end(), h->hostname) - peers.begin();
      out.push_back(slot_info{h->hostname, ranks[lr], static_cast<int>(lr), static_cast<int>(pos),
                              size, static_cast<int>(ranks.size()),
                              static_cast<int>(peers.size())});
    }
  }
  return out;
}

void rank_registry::add(const std::string& hostname, const std::string& node, int rank) {
  for (auto& [n, ranks] : nodes_)
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end())
      throw std::invalid_argument(
          fmt::format("rank {} registered twice (nodes {} and {})", rank, n, node));
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return p.first == node; });
  if (it == nodes_.end()) {
    nodes_.emplace_back(node, std::vector<int>{});
    hostnames_.push_back(hostname);
    it = nodes_.end() - 1;
  }
  it->second.insert(std::upper_bound(it->second.begin(), it->second.end(), rank), rank);
}

std::vector<slot_info> rank_registry::plan() const {
  auto values = finalize();
  std::vector<slot_info> out(values.size());
  for (size_t n = 0; n < nodes_.size(); ++n)
    for (int r : nodes_[n].second) {
      auto& v = values[r];
      out[r] = slot_info{hostnames_[n], r,           v.local_rank, v.cross_rank, world_size(),
                         v.local_size,  v.cross_size};
    }
  return out;
}

int rank_registry::world_size() const {
  int n = 0;
  for (auto& p : nodes_)
    n += static_cast<int>(p.second.size());
  return n;
}

std::string rank_registry::node_string() const {
  std::string out;
  for (auto& [node, ranks] : nodes_)
    out += fmt::format("{}{}:{}", out.empty() ? "" : ",", node, ranks.size());
  return out;
}

std::vector<local_cross> rank_registry::finalize() const {
  auto size = world_size();
  std::vector<local_cross> out(size);
  std::vector<bool> seen(size, false);
  std::map<int, int> cross_size; // local rank -> number of nodes having it
  std::map<int, int> cross_rank; // world rank -> position among those nodes
  for (auto& [node, ranks] : nodes_)
    for (int lr = 0; lr < static_cast<int>(ranks.size()); ++lr)
      cross_rank[ranks[lr]] = cross_size[lr]++;
  for (auto& [node, ranks] : nodes_) {
    for (int lr = 0; lr < static_cast<int>(ranks.size()); ++lr) {
      int r = ranks[lr];
      if (r < 0 || r >= size || seen[r])
        throw std::invalid_argument(
            fmt::format("ranks must be 0..{} without gaps, got rank {}", size - 1, r));
      seen[r] = true;
      out[r] = local_cross{lr, static_cast<int>(ranks.size()), cross_rank[r], cross_size[lr]};
    }
  }
  return out;
}

} // namespace cafhvd
