// kv_store: the state behind the rendezvous server.
#include "runtime/horovod/kv_store.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace cafhvd {

uint64_t kv_store::init(const std::vector<slot_info>& plan) {
  auto old = std::move(waiters_);
  waiters_.clear();
  waiting_for_.clear();
  data_.clear();
  finished_.clear();
  sizes_.clear();
  hosts_.clear();
  owners_.clear();
  total_ = 0;
  keys_ = 0;
  adhoc_bytes_ = adhoc_keys_ = 0;
  for (auto& s : plan) {
    for (auto scope :
         {std::string{"global"}, "local_" + s.hostname, "cross_" + std::to_string(s.local_rank)})
      hosts_[scope].insert(s.hostname);
    owners_["global"][s.rank] = s.hostname;
    owners_["local_" + s.hostname][s.local_rank] = s.hostname;
    owners_["cross_" + std::to_string(s.local_rank)][s.cross_rank] = s.hostname;
    sizes_["global"] = s.size;
    sizes_["local_" + s.hostname] = s.local_size;
    sizes_["cross_" + std::to_string(s.local_rank)] = s.cross_size;
  }
  if (!plan.empty()) {
    std::vector<int> all(static_cast<size_t>(plan.front().size));
    for (size_t r = 0; r < all.size(); ++r)
      all[r] = static_cast<int>(r);
    auto suffix = horovod_process_set_suffix(all);
    for (auto [scope, ranks] : std::map{owners_})
      owners_[scope + suffix] = std::move(ranks);
  }
  ++generation_;
  for (auto& [id, w] : old)
    w.fn(std::nullopt);
  return generation_;
}

kv_store::put_result kv_store::put(const std::string& scope, const std::string& key, bytes value) {
  if (value.size() > limits_.max_value)
    return put_result::too_large;
  auto& s = data_[scope];
  auto it = s.find(key);
  size_t old = it == s.end() ? 0 : it->second.size();
  bool adhoc = !sizes_.count(scope);
  bool new_key = it == s.end();
  bool full =
      total_ - old + value.size() > limits_.max_total || (new_key && keys_ >= limits_.max_keys);
  if (adhoc)
    full = full
           || static_cast<double>(adhoc_bytes_ - old + value.size())
                  > limits_.adhoc_share * static_cast<double>(limits_.max_total)
           || (new_key
               && static_cast<double>(adhoc_keys_ + 1)
                      > limits_.adhoc_share * static_cast<double>(limits_.max_keys));
  if (full) {
    if (s.empty())
      data_.erase(scope);
    return put_result::store_full;
  }
  account(scope, static_cast<long>(value.size()) - static_cast<long>(old), new_key ? 1 : 0);
  auto& slot = s[key];
  slot = std::move(value);
  // Wake waiters of this key; collect first, since a callback may touch the store.
  std::vector<waiter_fn> ready;
  if (auto ids = waiting_for_.find({scope, key}); ids != waiting_for_.end()) {
    for (auto id : ids->second) {
      auto w = waiters_.find(id);
      ready.push_back(std::move(w->second.fn));
      waiters_.erase(w);
    }
    waiting_for_.erase(ids);
  }
  auto copy = ready.empty() ? bytes{} : slot;
  for (auto& fn : ready)
    fn(copy);
  return put_result::ok;
}

std::optional<kv_store::bytes> kv_store::get(const std::string& scope,
                                             const std::string& key) const {
  auto s = data_.find(scope);
  if (s == data_.end())
    return std::nullopt;
  auto it = s->second.find(key);
  if (it == s->second.end())
    return std::nullopt;
  return it->second;
}

void kv_store::account(const std::string& scope, long bytes, long keys) {
  total_ = static_cast<size_t>(static_cast<long>(total_) + bytes);
  keys_ = static_cast<size_t>(static_cast<long>(keys_) + keys);
  if (!sizes_.count(scope)) {
    adhoc_bytes_ = static_cast<size_t>(static_cast<long>(adhoc_bytes_) + bytes);
    adhoc_keys_ = static_cast<size_t>(static_cast<long>(adhoc_keys_) + keys);
  }
}

void kv_store::erase_key(const std::string& scope_name, std::map<std::string, bytes>& scope,
                         std::map<std::string, bytes>::iterator it) {
  account(scope_name, -static_cast<long>(it->second.size()), -1);
  scope.erase(it);
}

std::optional<int> canonical_rank(std::string_view key) {
  if (key.empty() || key.size() > 7 || (key.size() > 1 && key[0] == '0')
      || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int r = 0;
  for (char c : key)
    r = r * 10 + (c - '0');
  return r;
}

void kv_store::finish(const std::string& scope, const std::string& key) {
  auto size = sizes_.find(scope);
  auto s = data_.find(scope);
  if (size != sizes_.end()) {
    // A rank of the scope, written as Horovod writes it: anything else would count as one
    // more finished rank and clear the scope under the ranks still reading it.
    auto rank = canonical_rank(key);
    if (!rank || *rank >= size->second)
      return;
    auto& done = finished_[scope];
    done.insert(key);
    if (static_cast<int>(done.size()) >= size->second) {
      if (s != data_.end()) {
        for (auto& [k, v] : s->second)
          account(scope, -static_cast<long>(v.size()), -1);
        data_.erase(s);
      }
      finished_.erase(scope);
    }
    return;
  }
  if (s == data_.end())
    return;
  for (auto& k : {key, "rank_" + key}) {
    auto it = s->second.find(k);
    if (it != s->second.end())
      erase_key(scope, s->second, it);
  }
  if (s->second.empty())
    data_.erase(s);
}

uint64_t kv_store::wait(const std::string& scope, const std::string& key, waiter_fn fn) {
  if (auto v = get(scope, key)) {
    fn(v);
    return 0;
  }
  auto id = next_waiter_++;
  waiters_.emplace(id, waiter{scope, key, std::move(fn)});
  waiting_for_[{scope, key}].insert(id);
  return id;
}

void kv_store::cancel_wait(uint64_t id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end())
    return;
  auto fn = std::move(it->second.fn);
  if (auto ids = waiting_for_.find({it->second.scope, it->second.key}); ids != waiting_for_.end()) {
    ids->second.erase(id);
    if (ids->second.empty())
      waiting_for_.erase(ids);
  }
  waiters_.erase(it);
  fn(std::nullopt);
}

std::optional<int> kv_store::scope_size(const std::string& scope) const {
  auto it = sizes_.find(scope);
  if (it == sizes_.end())
    return std::nullopt;
  return it->second;
}

std::string horovod_process_set_suffix(const std::vector<int>& ranks) {
  std::string list;
  for (auto r : ranks)
    list += std::to_string(r) + ',';
  return fmt::format("_process_set_hash_{:x}", std::hash<std::string>{}(list));
}

const std::set<std::string>* kv_store::scope_hosts(const std::string& scope) const {
  if (auto it = hosts_.find(scope); it != hosts_.end())
    return &it->second;
  constexpr std::string_view marker = "_process_set_hash_";
  auto at = scope.rfind(marker);
  if (at == std::string::npos || at + marker.size() == scope.size()
      || scope.find_first_not_of("0123456789abcdef", at + marker.size()) != std::string::npos)
    return nullptr;
  auto it = hosts_.find(scope.substr(0, at));
  return it == hosts_.end() ? nullptr : &it->second;
}

const std::string* kv_store::rank_host(const std::string& scope, int rank) const {
  auto it = owners_.find(scope);
  if (it == owners_.end())
    return nullptr;
  auto r = it->second.find(rank);
  return r == it->second.end() ? nullptr : &r->second;
}

std::vector<std::pair<std::string, kv_store::bytes>>
kv_store::entries(const std::string& scope) const {
  std::vector<std::pair<std::string, bytes>> out;
  if (auto s = data_.find(scope); s != data_.end())
    out.assign(s->second.begin(), s->second.end());
  return out;
}

size_t kv_store::key_count(const std::string& scope) const {
  auto it = data_.find(scope);
  return it == data_.end() ? 0 : it->second.size();
}

} // namespace cafhvd
