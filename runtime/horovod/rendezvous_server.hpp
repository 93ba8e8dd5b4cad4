// The rendezvous HTTP server: Horovod's key/value protocol (PUT/GET/DELETE
// /<scope>/<key>) on Boost.Beast, event-driven on one thread, plus a long-poll GET
// (`?wait_ms=N`) that answers the moment a key arrives instead of by client polling.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/network/allowlist.hpp"
#include "runtime/job/assignment.hpp"
#include "runtime/horovod/kv_store.hpp"
#include "runtime/network/socket_abort.hpp"

namespace cafhvd {

struct rendezvous_options {
  std::string bind = "127.0.0.1"; // one address, never every interface by default
  uint16_t port = 0;              // 0 = a free port
  // Budgets, each separate, so that one kind of waiting cannot shut out the others:
  size_t max_connections = 4096; // connections reading or answering a request
  size_t max_held = 16384;       // held rank_and_size requests (full: 503 at once)
  size_t max_long_polls = 4096;  // long polls waiting (full: answered as if their wait ended)
  // per client address (loopback, the driver's own host, is exempt): ordinary
  // connections and long polls of one address
  size_t max_connections_per_client = 1024;
  size_t max_long_polls_per_client = 256;
  bool loopback_exempt = true; // tests turn it off to see the per-client limits
  // When set: only these clients connect, and a rank_and_size vote is taken only from an
  // address of the host it names; refusals are reported once per address.
  std::shared_ptr<address_allowlist> allowlist;
  std::function<void(const std::string&)> on_refused;
  std::chrono::milliseconds request_timeout{10000}; // to receive one whole request
  std::chrono::milliseconds max_wait{600000};       // cap of a long-poll GET
  kv_store::limits limits;
};

/// Counters for tests and diagnostics (read on the caller's thread, approximate).
struct rendezvous_stats {
  uint64_t requests = 0;
  uint64_t rejected = 0; // 4xx answers and dropped connections
  uint64_t connections_refused = 0;
  uint64_t accept_errors = 0; // e.g. out of descriptors; accepting resumes after a pause
  uint64_t held_refused = 0;  // rank_and_size answered 503: the held budget was full
  uint64_t polls_cut = 0;     // long polls answered at once: their budget was full
  uint64_t strangers = 0;     // connections and votes refused by the allowlist
  size_t connections = 0, held = 0, long_polls = 0; // now
};

/// The answer to one parsed request, without I/O: `wait_ms > 0` means "hold the request
/// until the key exists" (a long-poll GET of an absent key). Used by the server and by
/// the fuzz target.
struct rendezvous_answer {
  int status = 0;
  std::string body;
  bool close = false; // the connection ends after this answer
  long wait_ms = 0;
};

rendezvous_answer answer_request(kv_store& store, std::string_view method, std::string_view target,
                                 std::string body, bool has_length);

/// A slot's key in rank_and_size: "<host>:<local_rank>".
std::string slot_key(const std::string& host, int local_rank);

/// rank_and_size's answer for a slot that is not in the job (Horovod's INVALID slot).
inline constexpr const char* slot_not_in_job = "-1,-1,-1,-1,-1,-1";

/// An elastic endpoint's request, parsed from a GET target without I/O (used by the
/// server and the fuzz target).
struct elastic_request {
  enum class kind { none, rank_and_size, update, bad } what = kind::none;
  std::string host; // rank_and_size
  int local_rank = -1;
  uint64_t after = 0; // update
  long wait_ms = 0;
  std::string error;     // bad: the 400 answer's body
  bool bad_name = false; // bad: the slot's host is not a host name (refused, reported)
};

/// `/rank_and_size/<host>:<local_rank>` or `/elastic/update[?after=G&wait_ms=N]` (waits
/// capped at `max_wait_ms`); kind::none for any other target.
elastic_request parse_elastic_request(std::string_view target, long max_wait_ms);

class rendezvous_server {
public:
  /// Binds and starts serving. Throws std::runtime_error naming the address on failure.
  explicit rendezvous_server(rendezvous_options opts);
  ~rendezvous_server();
  rendezvous_server(const rendezvous_server&) = delete;
  rendezvous_server& operator=(const rendezvous_server&) = delete;

  uint16_t port() const;
  const std::string& address() const;

  /// Starts a new plan (see kv_store::init); waits until the server applied it.
  uint64_t init(const std::vector<slot_info>& plan);
  rendezvous_stats stats() const;

  // -- elastic jobs ---------------------------------------------------------------------
  // GET /rank_and_size/<host>:<local_rank> is Horovod's elastic barrier: the request is
  // held, `on_vote(host, local_rank)` is called (on the server's thread), and the answer
  // comes with release() or answer_slot(). GET /elastic/update[?after=G&wait_ms=N] tells
  // programs the latest generation and what changed (held while it is still G).

  /// Turns the two endpoints on; without this they are plain (absent) keys. With
  /// `on_register`, a PUT /worker_addresses/<host>:<local_rank> (a Horovod worker's
  /// notification service) is stored as usual and its body handed over (on the server's
  /// thread); with an allowlist, only from an address of the host it names.
  void enable_elastic(
      std::function<void(const std::string& host, int local_rank)> on_vote,
      std::function<void(const std::string& host, int local_rank, const std::string& body)>
          on_register = {});

  /// Starts the plan's generation: the store is re-initialised with `plan`, then every
  /// held rank_and_size request is answered with its slot's six integers, or with
  /// "-1,-1,-1,-1,-1,-1" when the slot is not in the plan.
  void release(const std::vector<slot_info>& plan);

  /// The listening addresses of Gloo pairs (see gloo_addresses) that ranks stored since
  /// the last init() or release(): every Gloo connection of that plan has one of them
  /// as an endpoint.
  std::set<tcp_endpoint> gloo_endpoints() const;

  /// Answers the held rank_and_size requests of one slot ("host:local_rank") with `body`.
  void answer_slot(const std::string& slot, const std::string& body);

  /// Reports how far each rank of the served plan got in Horovod's Gloo rendezvous of the
  /// scopes `global` and `cross_<local_rank>` (hvd.init() does global, local_<host>, then
  /// cross_<local_rank>): `connected` false at its first PUT /<scope>/rank_<r> (it reached
  /// that rendezvous), true at its DELETE /<scope>/<r> (Horovod's Finalize: it connected to
  /// every peer of the scope). `rank` is the rank within the scope. Each at most once per
  /// scope, rank and plan, ranks below the scope's planned size only; called on the
  /// server's thread with the store's generation (1 for the first init() or release(),
  /// then one more for each).
  /// `client` is the request's peer address: whether it may speak for the rank's host is
  /// the caller's to decide (reports are once per scope, rank, kind and client).
  void on_gloo_progress(std::function<void(uint64_t store_generation, const std::string& scope,
                                           int rank, bool connected, const std::string& client)>
                            fn);

  // -- warm joins: parking lots ----------------------------------------------------------
  // A newcomer of a plan that is not released yet starts at once and is pointed at a lot:
  // a port of its own (same address) whose every request is held, unread by the store,
  // until the lot's release. It thus waits at its first rendezvous without touching the
  // scopes of the plan that runs (Horovod's keys carry no generation).

  /// Opens lot `id` (a listening port, returned); `on_parked(id, rank, client)` is called
  /// (on the server's thread) the first time a held request of the lot from `client` is a
  /// rank's first Gloo request, PUT /global/rank_<rank> (whether `client` speaks for the
  /// rank is the caller's to decide).
  uint16_t open_lot(uint64_t id);
  void on_parked(std::function<void(uint64_t lot, int rank, const std::string& client)> fn);
  /// The lot's held requests are served now, in the order they came, and every later one
  /// as on the main port (call after the plan's release()).
  void release_lot(uint64_t id);
  /// Stops listening on the lot and closes its connections (its plan was replaced).
  void close_lot(uint64_t id);

  /// Publishes the newest generation and its description; wakes update waiters.
  void set_update(uint64_t generation, const std::string& text);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace cafhvd
