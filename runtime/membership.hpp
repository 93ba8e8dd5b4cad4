// The cluster's live table of node agents (plain C++; the actors in actors/cluster.cpp
// hold one and feed it): who joined, with what, when each was last heard of, and which
// jobs run where. Soft state: everything in it comes again from the agents' re-joins, so
// losing its holder loses nothing a running job needs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/credentials.hpp"

namespace cafhvd {

/// One job's share of a node, as its agent reports it.
struct job_summary {
  std::string job;   // the job's id
  std::string owner; // the driver certificate's name that started it ("" with --insecure)
  uint32_t ranks = 0;
  std::vector<int32_t> gpus; // devices it holds on the node
  int64_t since_ms = 0;      // Unix ms when its colocator started
};

/// What an agent says about itself when it joins and in each update.
struct member_info {
  std::string name;    // its --name (HOROVOD_HOSTNAME of its ranks)
  std::string address; // where drivers reach it
  uint16_t port = 0;
  uint32_t slots = 0; // its --slots (0: not limited)
  std::vector<int32_t> gpus, gpus_free;
  std::vector<std::string> labels; // KEY=VALUE, sorted
  int64_t started_ms = 0;          // Unix ms when the agent started
  std::vector<job_summary> jobs;
  bool draining = false; // reserved for drain (it takes no new work)
};

/// A row of the table.
struct member_row {
  member_info info;
  std::string state;       // alive, lost (its link broke), left (it stopped)
  std::string certificate; // the certificate it joined with
  bool shared = false;     // a certificate every host may hold (it proves no name)
  int64_t joined_ms = 0, last_seen_ms = 0, gone_ms = 0;
};

/// What `caf-hvd status` gets: the table, or where the table is.
struct cluster_view {
  std::string holder;   // the agent that holds the table
  std::string redirect; // set instead of a table: this agent joined the one at HOST:PORT
  int64_t now_ms = 0;
  std::vector<member_row> nodes; // by name
};

/// `--label KEY=VALUE` values, checked and sorted (a key at most once). Keys: 1 to 63
/// letters, digits, '.', '-', '_' or '/'; values: 0 to 253 of those and ':' '+' '@'.
/// Throws std::invalid_argument naming the label and the rule.
std::vector<std::string> parse_labels(const std::vector<std::string>& given);

/// Where a cluster's table is: `HOST[:PORT]` (`--join`, `--cluster`, $CAF_HVD_CLUSTER).
struct cluster_address {
  std::string host;
  uint16_t port = 0;
};
/// Throws std::invalid_argument saying what is wrong.
cluster_address parse_cluster_address(std::string_view text, uint16_t default_port);

class membership_table {
public:
  /// An agent joins under `info.name`, proven by `holder` (its join ticket). Returns ""
  /// or why it is refused: a certificate issued for another name, or the name held by a
  /// live agent (a different `member`). The same member joining again (its holder lost
  /// the table and came back) replaces its row.
  std::string join(uint64_t member, const member_info& info, const ticket_holder& holder,
                   int64_t now_ms);
  /// A joined member's news; false when `member` holds no row (it must join first).
  bool update(uint64_t member, const member_info& info, int64_t now_ms);
  /// Its link broke (lost) or it said it stops (left); returns the names it held.
  std::vector<std::string> gone(uint64_t member, bool left, int64_t now_ms);
  /// Forgets rows gone for longer than `keep_ms`.
  void expire(int64_t now_ms, int64_t keep_ms);
  /// The table at `now_ms`.
  cluster_view view(int64_t now_ms) const;
  size_t alive() const;

private:
  struct entry {
    uint64_t member = 0;
    member_row row;
  };
  std::map<std::string, entry> rows_; // by name
};

/// The view as `caf-hvd status` prints it (a node table, then a job table).
std::string render_status(const cluster_view& v);
/// ... and as `--json` prints it.
nlohmann::json status_json(const cluster_view& v);

} // namespace cafhvd
