// The rendezvous key/value state, without networking: scopes of opaque values, the
// scope sizes of the current plan, per-scope finish counting, and waiters for keys that
// do not exist yet. Fixes Horovod's store faults: a finished scope clears only itself,
// a new plan never serves keys of an old one, and memory is bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/job/assignment.hpp"

namespace cafhvd {

/// The suffix Horovod 0.28 gives the Gloo scopes of a process set of `ranks` (global
/// ranks, ascending): "_process_set_hash_" and std::hash of "r0,r1,...," in hex
/// (GlooContext::Initialize). Process set 0, every rank, also has such scopes.
std::string horovod_process_set_suffix(const std::vector<int>& ranks);

/// A rank number as Horovod and Gloo write it in keys ("0", "17"; no sign, no leading
/// zero, at most 7 digits), or nullopt.
std::optional<int> canonical_rank(std::string_view key);

class kv_store {
public:
  using bytes = std::string;
  /// Called once with the value when the key appears, or with nullopt when the waiter
  /// is cancelled (a new plan, or the caller gave up).
  using waiter_fn = std::function<void(const std::optional<bytes>&)>;

  struct limits {
    size_t max_value = 16u << 20;  // one value
    size_t max_total = 256u << 20; // all values together (the job's byte budget)
    size_t max_keys = 1u << 20;    // all keys together (the job's key budget)
    // Ad-hoc scopes (anything but global, local_<host>, cross_<k>) get at most this
    // share of both budgets, so the planned scopes always have room to rendezvous.
    double adhoc_share = 0.75;
  };

  kv_store() = default;
  explicit kv_store(limits l) : limits_(l) {}

  /// Starts a new plan: drops every key and waiter, sets the sizes of `global`,
  /// `local_<host>` and `cross_<local_rank>` from the slots. Returns the generation.
  uint64_t init(const std::vector<slot_info>& plan);

  enum class put_result { ok, too_large, store_full };
  put_result put(const std::string& scope, const std::string& key, bytes value);

  std::optional<bytes> get(const std::string& scope, const std::string& key) const;

  /// Horovod's DELETE /<scope>/<rank>: in a planned scope, marks `key` (a rank of the
  /// scope, canonical_rank; anything else is ignored) finished and clears the scope once
  /// all of its ranks finished; in an ad-hoc scope, removes the
  /// rank's keys (`<rank>` and gloo's `rank_<rank>`).
  void finish(const std::string& scope, const std::string& key);

  /// Calls `fn` at once if the key exists, else when it is put. Returns an id for
  /// cancel_wait (0 when `fn` already ran).
  uint64_t wait(const std::string& scope, const std::string& key, waiter_fn fn);
  void cancel_wait(uint64_t id);

  /// Every key and value of a scope, in key order.
  std::vector<std::pair<std::string, bytes>> entries(const std::string& scope) const;

  uint64_t generation() const { return generation_; }
  std::optional<int> scope_size(const std::string& scope) const;
  /// The hosts whose ranks use a planned scope (`global`: all; `local_<h>`: h;
  /// `cross_<k>`: those with a local rank k), or nullptr for an ad-hoc scope. A Horovod
  /// process set's scope (`<planned>_process_set_hash_<hex>`) is used by some of its
  /// planned scope's hosts: those are given for it.
  const std::set<std::string>* scope_hosts(const std::string& scope) const;
  /// The host of the rank `rank` of a planned scope (its rank within the scope), or
  /// nullptr (an ad-hoc scope, a rank out of range). Horovod's process set 0 (every
  /// rank) repeats the planned scopes with its suffix (horovod_process_set_suffix), and
  /// its ranks are theirs; the ranks of another process set are not known here.
  const std::string* rank_host(const std::string& scope, int rank) const;
  /// Whether rank_host knows the ranks of this scope.
  bool ranks_known(const std::string& scope) const { return owners_.count(scope) != 0; }
  size_t total_keys() const { return keys_; }
  size_t adhoc_bytes() const { return adhoc_bytes_; }
  size_t total_bytes() const { return total_; }
  size_t key_count(const std::string& scope) const;

private:
  struct waiter {
    std::string scope, key;
    waiter_fn fn;
  };
  void erase_key(const std::string& scope_name, std::map<std::string, bytes>& scope,
                 std::map<std::string, bytes>::iterator it);

  limits limits_;
  uint64_t generation_ = 0;
  size_t total_ = 0;
  size_t keys_ = 0;
  size_t adhoc_bytes_ = 0, adhoc_keys_ = 0; // of that, in ad-hoc scopes
  void account(const std::string& scope, long bytes, long keys);
  std::map<std::string, std::map<std::string, bytes>> data_;
  std::map<std::string, int> sizes_;
  std::map<std::string, std::set<std::string>> hosts_;
  std::map<std::string, std::map<int, std::string>> owners_; // scope -> rank -> host
  std::map<std::string, std::set<std::string>> finished_;
  std::map<uint64_t, waiter> waiters_;
  // (scope, key) -> its waiters in the order they came: a PUT wakes only these
  std::map<std::pair<std::string, std::string>, std::set<uint64_t>> waiting_for_;
  uint64_t next_waiter_ = 1;
};

} // namespace cafhvd
