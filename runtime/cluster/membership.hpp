// The cluster's live table of node agents (plain C++; the actors in actors/cluster.cpp
// hold one and feed it): who joined, with what, when each was last heard of, and which
// jobs run where. Soft state: everything in it comes again from the agents' re-joins, so
// losing its holder loses nothing a running job needs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/cluster/credential_files.hpp"

namespace cafhvd {

/// One job's share of a node, as its agent reports it.
struct job_summary {
  std::string job;   // the job's id
  std::string owner; // the driver certificate's name that started it ("" with --insecure)
  uint32_t ranks = 0;
  std::vector<int32_t> gpus; // devices it holds on the node
  int64_t since_ms = 0;      // Unix ms when its colocator started
};

/// Words of every refusal of a full node (node_book::take's why): a job tells a node
/// full of other jobs' ranks (wait) from a broken one (blacklist) by them.
inline constexpr std::string_view node_full_words = " for all jobs and ";

/// A node agent's jobs and slots: its `--slots` is the node's capacity for all jobs
/// together (0: not limited); each live worker holds one node-wide slot index, from its
/// spawn until it is gone, whichever job it belongs to. Thread-safe.
class node_book {
public:
  void set_capacity(uint32_t slots);
  /// A job's colocator starts (its summary, ranks 0) or ends.
  void open(uint64_t colocator, job_summary job);
  void close(uint64_t colocator);
  /// `n` slot indices for the colocator's new workers (the lowest free ones), or none and
  /// why (which jobs hold the node's slots).
  std::vector<uint32_t> take(uint64_t colocator, uint32_t n, std::string& why);
  void give_back(uint64_t colocator, uint32_t index);
  /// Whether `n` more slots for the colocator fit once `ending` of its own workers' slots
  /// are back: a job that replaces its ranks on this node asks before the old ones are
  /// gone, and waits for them instead of being refused (false with no limit or nothing
  /// of its own ending).
  bool fits_once_own_end(uint64_t colocator, uint32_t n, uint32_t ending) const;
  void set_gpus(uint64_t colocator, std::vector<int32_t> devices);
  std::vector<job_summary> snapshot() const;
  uint32_t capacity() const;
  /// Called (on the changing thread, outside the book's lock) after each change of the
  /// jobs or their slots: the agent's joiner reports the change to the table at once.
  void on_change(std::function<void()> f);

private:
  std::vector<uint32_t> take_locked(uint64_t colocator, uint32_t n, std::string& why);
  void changed() const;
  mutable std::mutex m_;
  std::function<void()> on_change_;
  uint32_t capacity_ = 0;
  std::map<uint64_t, job_summary> jobs_;       // by colocator
  std::map<uint32_t, uint64_t> held_;          // slot index -> colocator
};

/// What an agent says about itself when it joins and in each update.
struct member_info {
  std::string name;    // its --name (HOROVOD_HOSTNAME of its ranks)
  std::string address; // where drivers reach it
  uint16_t port = 0;
  uint32_t slots = 0; // its --slots (0: not limited)
  uint32_t cpus = 0;  // its processors (placement's capacity when --slots is not given)
  std::vector<int32_t> gpus, gpus_free;
  std::vector<std::string> labels; // KEY=VALUE, sorted
  int64_t started_ms = 0;          // Unix ms when the agent started
  std::vector<job_summary> jobs;
  bool draining = false; // reserved for drain (it takes no new work)
  // what its agent refused since it started, per peer ("'CN' (role)"): connections the
  // wire guard closed, messages its actors refused for their sender
  std::map<std::string, uint64_t> refused_connections, refused_messages;
};

/// A row of the table.
struct member_row {
  member_info info;
  std::string state;       // alive, lost (its link broke), left (it stopped)
  std::string certificate; // the certificate it joined with
  bool shared = false;     // a certificate every host may hold (it proves no name)
  int64_t joined_ms = 0, last_seen_ms = 0, gone_ms = 0;
  bool drained = false; // an administrator drained it (kept across its re-joins)
};

/// What `caf-hvd status` gets: the table, or where the table is.
struct cluster_view {
  std::string holder;   // the agent that holds the table
  std::string redirect; // set instead of a table: this agent joined the one at HOST:PORT
  int64_t now_ms = 0;
  std::vector<member_row> nodes; // by name
  // jobs the table knows before their ranks run: waiting in line (ranks: the -np asked,
  // since: when it first asked) and placed with slots held for ranks not started yet
  // (ranks: the slots still held, since: when it was placed)
  std::vector<job_summary> waiting, placed;
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

/// A driver asks the table for slots (`caf-hvd driver --cluster`).
struct placement_request {
  std::string job; // its id: the agents' reports name it once its ranks run
  uint32_t np = 0;
  bool spread = false;             // across nodes (default: packed on as few as possible)
  std::vector<std::string> labels; // KEY=VALUE every chosen node must have
  uint32_t hold_ms = 0; // how long the table holds the slots for the job before its ranks run
  // what each rank needs of a node besides its slot (0: nothing), counted as Ray's
  // RayHostDiscovery counts: a node fits min(free slots, free CPUs / cpus_per_slot, free
  // GPUs / gpus_per_slot) more ranks
  uint32_t cpus_per_slot = 0, gpus_per_slot = 0;
};

struct placed_host {
  std::string name, address;
  uint16_t port = 0;
  uint32_t slots = 0;
  bool holder = false; // the table's own agent: the driver reaches it where it reached the table

  /// Where a driver that reached the table at `table_host` reaches this node: the table's
  /// own agent there, unless that was a loopback address (the head node's own agent):
  /// then where the node says it is, which the job's other hosts can reach too.
  const std::string& reach(const std::string& table_host) const;
};

/// The table's answer: hosts, or that the job waits (and for what), or why never.
struct placement {
  std::string error; // the request cannot be met by this cluster (or is malformed)
  bool waiting = false;
  std::string waiting_for; // "3 slots: 5 free of 8, 3 held by job 7"
  std::vector<placed_host> hosts;
};

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
  /// Forgets rows gone for longer than `keep_ms`, holds that ran out or whose ranks run,
  /// and waiting jobs that stopped asking.
  void expire(int64_t now_ms, int64_t keep_ms);
  /// An administrator drains (true) or undrains a node: it gets no new ranks, elastic
  /// jobs leave it. An undrain also clears the node's own draining mark until its next
  /// report (it is being told). "" or why not (no such node).
  std::string set_drained(const std::string& name, bool drained);
  /// Whether an administrator drained `name` (kept while it is away: it is told when it
  /// joins again).
  bool drained(const std::string& name) const;
  /// Whether an administrator's last word on `name` was an undrain (given while it was
  /// away, it is told when it joins again: a node that kept its drain across its own
  /// restart drops it then).
  bool undrained(const std::string& name) const;
  /// The member that holds `name`'s row (for telling it), if alive.
  std::optional<uint64_t> member_of(const std::string& name) const;
  /// The table at `now_ms`.
  cluster_view view(int64_t now_ms) const;
  size_t alive() const;

  /// Places a job on free slots, or queues it: jobs are served in the order they first
  /// asked, and a job asks again (the same request) until it is placed; one that has not
  /// asked for `forget_ms` loses its place. A placed job's slots are held for it (no other
  /// job gets them) until the agents report its ranks there or `hold_ms` passes.
  /// `owner`: the name of the driver certificate that asks (a job id held or queued for
  /// another owner is refused, so no driver takes or frees another's job by its id).
  placement place(const placement_request& r, int64_t now_ms, const std::string& owner = {},
                  int64_t forget_ms = 5000);
  /// The job's driver is gone: slots held for it are free (its agents free theirs).
  void release(const std::string& job, const std::string& owner = {});
  /// An elastic job's discovery: every live node (with `labels`, not draining) and the
  /// slots `job` may use there (capacity less other jobs' ranks and holds, and less what
  /// jobs waiting in line asked for: it keeps its own ranks but grows only into slots no
  /// waiting job needs), those with none left out.
  std::vector<placed_host> available(const placement_request& r, int64_t now_ms);
  /// An elastic job that follows the table was told `hosts` (available()): the slots there
  /// beyond its running ranks, at most `r.np` less its ranks in all (0: no bound, its
  /// --max-np), are held for it until its ranks there run or `hold_ms` passes, so a job
  /// that asks next is not told the same free slots (two growing jobs would both plan
  /// ranks on them, and one would be refused). Each ask replaces the job's last growth
  /// hold; a placed job's hold is left as it is. `owner`: the asking driver's name.
  void hold_growth(const placement_request& r, const std::vector<placed_host>& hosts,
                   int64_t now_ms, const std::string& owner = {}, int64_t hold_ms = 10000);
  /// A table whose agent restarted: the members its last table had (`expected`) are
  /// joining again. Until they all have, or `until_ms`, a job that does not fit yet waits
  /// instead of being refused, and discovery is answered as not final, so elastic jobs
  /// keep their host sets rather than take a half-filled table for the cluster.
  void rejoin_until(int64_t until_ms, int64_t started_ms, std::vector<std::string> expected);
  /// Why the table's answers are not final yet at `now_ms` ("" once they are).
  std::string rejoining(int64_t now_ms) const;
  /// The names of the members a restarted table waits for: alive, or lost (not those that
  /// said they stop); for the holder's state directory.
  std::vector<std::string> member_names() const;
  /// What placement holds (slots held for placed jobs whose ranks have not started, and
  /// the jobs waiting in line, in order), for the holder's state directory; and back, in
  /// a table that restarted: a held slot on a node that has not joined again yet stays
  /// held while the table waits for its members (rejoin_until), and waiting jobs keep
  /// their places if they ask again within `forget_ms` of `now_ms`. Throws
  /// std::runtime_error for a text that is not such a record.
  std::string placements_text() const;
  void restore_placements(const std::string& text, int64_t now_ms);

private:
  int64_t rejoin_until_ms_ = 0, started_ms_ = 0;
  std::vector<std::string> expected_;
  struct held {
    std::string owner;
    std::map<std::string, uint32_t> slots; // node -> slots not yet reported by its agent
    int64_t until_ms = 0, since_ms = 0;
    placement answer;
    bool growth = false; // an elastic job's growth (hold_growth), not a placement
  };
  std::map<std::string, held> held_; // by job
  // What a rank of a job placed or discovering here needs (CPUs, GPUs): a node's other
  // jobs' ranks count one CPU each unless the table knows better. Forgotten once no node
  // reports the job and nothing is held for it.
  std::map<std::string, std::pair<uint32_t, uint32_t>> needs_;
  struct fit {
    uint32_t free = 0; // free slots (capacity less other jobs' ranks and holds)
    uint32_t fits = 0; // ... that a rank of this job also finds CPUs and GPUs for
    uint64_t used = 0; // slots other jobs use or hold
  };
  fit fit_of(const std::string& name, const member_row& row, const std::string& job,
             uint32_t cpus_per_slot, uint32_t gpus_per_slot,
             std::map<std::string, uint64_t>* holders = nullptr) const;
  struct asked {
    std::string job, owner;
    int64_t last_ms = 0;
    placement_request request; // what it waits for: elastic jobs do not grow into it
    int64_t first_ms = 0;      // when it first asked
  };
  std::vector<asked> queue_;
  void settle(int64_t now_ms, int64_t forget_ms);

  struct entry {
    uint64_t member = 0;
    member_row row;
    bool undrained = false; // an administrator's last word on it was an undrain
  };
  std::map<std::string, entry> rows_; // by name
};

/// The view as `caf-hvd status` prints it (a node table, then a job table).
std::string render_status(const cluster_view& v);
/// ... and as `--json` prints it.
nlohmann::json status_json(const cluster_view& v);
/// The job table alone (`caf-hvd jobs`): running, starting (slots held) and waiting jobs.
std::string render_jobs(const cluster_view& v);
nlohmann::json jobs_json(const cluster_view& v);

} // namespace cafhvd
