// The TCPStore protocol state machine (dialects and sources: see the header).
#include "runtime/torch/torch_store_protocol.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace cafhvd {

namespace {

constexpr uint32_t validate_magic = 0x3C85F7CE;
constexpr char stop_waiting = 0;
constexpr char wait_canceled = 1;
constexpr char ready = 0;
constexpr char not_ready = 1;

struct protocol_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T> void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_bytes(std::string& out, std::string_view b) {
  put<uint64_t>(out, b.size());
  out.append(b);
}

// Parses a whole decimal int64, as torch's std::stoll would accept it.
bool parse_int64(const std::string& s, int64_t& v) {
  if (s.empty() || s.size() > 32)
    return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str())
    return false;
  v = x;
  return true;
}

} // namespace

const char* to_string(torch_dialect d) {
  switch (d) {
  case torch_dialect::unknown:
    return "undetermined";
  case torch_dialect::legacy_any:
    return "torch 1.13-2.1";
  case torch_dialect::legacy:
    return "torch 1.13/2.0";
  case torch_dialect::legacy21:
    return "torch 2.1";
  case torch_dialect::modern:
    return "torch 2.2+";
  }
  return "?";
}

enum class torch_store_core::op {
  set,
  compare_set,
  get,
  add,
  check,
  wait,
  num_keys,
  watch_key,
  delete_key,
  append,
  multi_get,
  multi_set,
  cancel_wait,
  ping,
  queue_push,
  queue_pop,
  queue_len,
  list_keys,
  barrier,
  validate,
  unknown,
};

// Reads fields from the unparsed input. A read that lacks bytes returns false (more
// input needed); a length over its limit throws, since waiting for it is pointless.
struct torch_store_core::cursor {
  std::string_view buf;
  size_t pos = 0;
  const torch_store_limits& lim;

  size_t left() const { return buf.size() - pos; }

  template <class T> bool value(T& v) {
    if (left() < sizeof(T))
      return false;
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }

  bool bytes(std::string& s, uint64_t max, const char* what) {
    uint64_t n = 0;
    if (!value(n))
      return false;
    if (n > max)
      throw protocol_error(
          fmt::format("a {} of {} bytes is over this store's limit of {} bytes", what, n, max));
    if (left() < n)
      return false;
    s.assign(buf.data() + pos, n);
    pos += n;
    return true;
  }

  bool key(std::string& s) { return bytes(s, lim.max_key, "key"); }
  bool val(std::string& s) { return bytes(s, lim.max_value, "value"); }

  bool count(uint64_t& n) {
    if (!value(n))
      return false;
    if (n > lim.max_keys_per_query)
      throw protocol_error(fmt::format("a query for {} keys is over this store's limit of {}", n,
                                       lim.max_keys_per_query));
    return true;
  }

  bool keys(std::vector<std::string>& ks) {
    uint64_t n = 0;
    if (!count(n))
      return false;
    ks.resize(n);
    for (auto& k : ks)
      if (!key(k))
        return false;
    return true;
  }
};

void torch_store_core::connect(conn_id c) {
  conns_[c];
}

void torch_store_core::disconnect(conn_id c) {
  auto it = conns_.find(c);
  if (it == conns_.end())
    return;
  cancel_wait(c, it->second);
  conns_.erase(it);
}

torch_dialect torch_store_core::dialect(conn_id c) const {
  auto it = conns_.find(c);
  return it == conns_.end() ? torch_dialect::unknown : it->second.dialect;
}

size_t torch_store_core::waiting_count() const {
  return static_cast<size_t>(
      std::count_if(conns_.begin(), conns_.end(), [](auto& kv) { return kv.second.waiting; }));
}

void torch_store_core::clear() {
  data_.clear();
  queues_.clear();
  bytes_ = 0;
  items_ = 0;
}

void torch_store_core::charge(uint64_t add_bytes, uint64_t add_items, const std::string& key) {
  if (bytes_ + add_bytes > limits_.max_total || items_ + add_items > limits_.max_keys)
    throw protocol_error(fmt::format(
        "a write to key '{}' is over the job's torch store budget ({} bytes in {} keys and "
        "queued items stored; limits {} bytes, {} keys)",
        key.substr(0, 64), bytes_, items_, limits_.max_total, limits_.max_keys));
  bytes_ += add_bytes;
  items_ += add_items;
}

void torch_store_core::assign(const std::string& key, std::string value) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    charge(key.size() + value.size(), 1, key);
    data_.emplace(key, std::move(value));
    return;
  }
  auto old = it->second.size();
  if (value.size() > old)
    charge(value.size() - old, 0, key);
  else
    bytes_ -= old - value.size();
  it->second = std::move(value);
}

size_t torch_store_core::erase(const std::string& key) {
  auto it = data_.find(key);
  if (it == data_.end())
    return 0;
  bytes_ -= key.size() + it->second.size();
  --items_;
  data_.erase(it);
  return 1;
}

bool torch_store_core::present(const std::string& key) const {
  if (data_.count(key))
    return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

torch_store_core::result torch_store_core::feed(conn_id c, std::string_view bytes) {
  result out;
  auto it = conns_.find(c);
  if (it == conns_.end()) {
    out.close = true;
    out.problem = "data on a connection the store does not know";
    return out;
  }
  auto& cn = it->second;
  cn.in.append(bytes);
  cursor cur{cn.in, 0, limits_};
  for (;;) {
    auto start = cur.pos;
    step s = step::fail;
    try {
      s = one_query(c, cn, cur, out);
    } catch (const protocol_error& e) {
      out.problem = e.what();
    }
    if (s == step::done)
      continue;
    if (s == step::need_more) {
      cur.pos = start;
      break;
    }
    out.close = true;
    cancel_wait(c, cn);
    return out;
  }
  cn.in.erase(0, cur.pos);
  if (cn.in.size() > limits_.max_buffered) {
    out.close = true;
    out.problem = fmt::format("a query of more than {} bytes", limits_.max_buffered);
    cancel_wait(c, cn);
  }
  return out;
}

torch_store_core::op torch_store_core::decode(connection& cn, uint8_t code, const cursor& cur,
                                              bool& known) {
  static constexpr op legacy_ops[] = {op::set,      op::compare_set, op::get,
                                      op::add,      op::check,       op::wait,
                                      op::num_keys, op::watch_key,   op::delete_key};
  static constexpr op legacy21_ops[] = {
      op::set,      op::compare_set, op::get,    op::add,       op::check,     op::wait,
      op::num_keys, op::delete_key,  op::append, op::multi_get, op::multi_set, op::cancel_wait};
  static constexpr op modern_ops[] = {
      op::validate,  op::set,       op::compare_set, op::get,        op::add,
      op::check,     op::wait,      op::num_keys,    op::delete_key, op::append,
      op::multi_get, op::multi_set, op::cancel_wait, op::ping,       op::queue_push,
      op::queue_pop, op::queue_len, op::list_keys,   op::barrier};
  known = true;
  switch (cn.dialect) {
  case torch_dialect::modern:
    if (code < std::size(modern_ops))
      return modern_ops[code];
    break;
  case torch_dialect::legacy:
    if (code < std::size(legacy_ops))
      return legacy_ops[code];
    break;
  case torch_dialect::legacy21:
    if (code < std::size(legacy21_ops))
      return legacy21_ops[code];
    break;
  case torch_dialect::unknown:
  case torch_dialect::legacy_any:
    if (code <= 6)
      return legacy_ops[code];
    if (code == 7 || (code >= 9 && code < std::size(legacy21_ops))) {
      cn.dialect = torch_dialect::legacy21;
      return legacy21_ops[code];
    }
    if (code == 8) {
      // v2.1's APPEND sends its value with the key; v1.13's DELETE_KEY sends nothing
      // more before its reply.
      cursor peek = cur;
      std::string k;
      if (!peek.key(k)) {
        known = false; // caller asks for more input
        return op::unknown;
      }
      cn.dialect = peek.left() > 0 ? torch_dialect::legacy21 : torch_dialect::legacy;
      return cn.dialect == torch_dialect::legacy21 ? op::append : op::delete_key;
    }
    break;
  }
  return op::unknown;
}

torch_store_core::step torch_store_core::one_query(conn_id c, connection& cn, cursor& cur,
                                                   result& out) {
  uint8_t code = 0;
  if (!cur.value(code))
    return step::need_more;
  std::string reply;
  auto answer = [&] {
    if (!reply.empty())
      out.sends.push_back({c, std::move(reply)});
    return step::done;
  };

  if (cn.dialect == torch_dialect::unknown) {
    if (code == 0) {
      uint32_t magic = 0;
      auto peek = cur;
      if (!peek.value(magic))
        return step::need_more;
      if (magic == validate_magic) {
        cur.pos = peek.pos;
        cn.dialect = torch_dialect::modern;
        return step::done; // VALIDATE has no reply
      }
    }
    cn.dialect = torch_dialect::legacy_any;
  }

  bool known = true;
  auto o = decode(cn, code, cur, known);
  if (!known)
    return step::need_more;
  if (o == op::unknown || o == op::validate) {
    out.problem = o == op::validate
                      ? std::string{"VALIDATE after the connection's first query"}
                      : fmt::format("query type {} is not part of the {} store protocol", code,
                                    to_string(cn.dialect));
    return step::fail;
  }

  switch (o) {
  case op::ping: {
    uint32_t nonce = 0;
    if (!cur.value(nonce))
      return step::need_more;
    put<uint32_t>(reply, nonce);
    return answer();
  }
  case op::set: {
    std::string k, v;
    if (!cur.key(k) || !cur.val(v))
      return step::need_more;
    assign(k, std::move(v));
    key_changed(k, out);
    return answer();
  }
  case op::compare_set: {
    std::string k, expected, desired;
    if (!cur.key(k) || !cur.val(expected) || !cur.val(desired))
      return step::need_more;
    auto it = data_.find(k);
    if (it == data_.end()) {
      if (expected.empty()) {
        assign(k, desired);
        put_bytes(reply, desired);
        key_changed(k, out);
      } else {
        put_bytes(reply, expected); // what torch's servers answer for a missing key
      }
    } else {
      if (it->second == expected)
        assign(k, desired);
      put_bytes(reply, data_.at(k));
      key_changed(k, out);
    }
    return answer();
  }
  case op::get: {
    std::string k;
    if (!cur.key(k))
      return step::need_more;
    auto it = data_.find(k);
    put_bytes(reply, it == data_.end() ? std::string_view{} : std::string_view{it->second});
    return answer();
  }
  case op::add: {
    std::string k;
    int64_t delta = 0;
    if (!cur.key(k) || !cur.value(delta))
      return step::need_more;
    int64_t now = 0;
    if (auto it = data_.find(k); it != data_.end() && !parse_int64(it->second, now))
      throw protocol_error(fmt::format("ADD to key '{}', whose value is not a number", k));
    if (__builtin_add_overflow(now, delta, &now))
      throw protocol_error(fmt::format("ADD to key '{}' overflows int64", k));
    assign(k, std::to_string(now));
    put<int64_t>(reply, now);
    key_changed(k, out);
    return answer();
  }
  case op::check: {
    std::vector<std::string> ks;
    if (!cur.keys(ks))
      return step::need_more;
    bool all = std::all_of(ks.begin(), ks.end(), [&](auto& k) { return present(k); });
    reply.push_back(all ? ready : not_ready);
    return answer();
  }
  case op::wait: {
    std::vector<std::string> ks;
    if (!cur.keys(ks))
      return step::need_more;
    wait_for(c, cn, ks, out);
    return step::done;
  }
  case op::num_keys:
    put<int64_t>(reply, static_cast<int64_t>(data_.size()));
    return answer();
  case op::watch_key:
    out.problem = "WATCH_KEY (torch 1.13's watch_key, removed in torch 2.1) is not served";
    return step::fail;
  case op::delete_key: {
    std::string k;
    if (!cur.key(k))
      return step::need_more;
    put<int64_t>(reply, static_cast<int64_t>(erase(k)));
    return answer();
  }
  case op::append: {
    std::string k, v;
    if (!cur.key(k) || !cur.val(v))
      return step::need_more;
    auto it = data_.find(k);
    size_t now = it == data_.end() ? 0 : it->second.size();
    if (now + v.size() > limits_.max_value)
      throw protocol_error(
          fmt::format("APPEND makes key '{}' longer than {} bytes", k, limits_.max_value));
    if (it == data_.end()) {
      assign(k, std::move(v));
    } else {
      charge(v.size(), 0, k);
      it->second += v;
    }
    key_changed(k, out);
    return answer();
  }
  case op::multi_get: {
    std::vector<std::string> ks;
    if (!cur.keys(ks))
      return step::need_more;
    for (auto& k : ks) {
      auto it = data_.find(k);
      put_bytes(reply, it == data_.end() ? std::string_view{} : std::string_view{it->second});
    }
    return answer();
  }
  case op::multi_set: {
    uint64_t n = 0;
    if (!cur.count(n))
      return step::need_more;
    std::vector<std::pair<std::string, std::string>> kvs(n);
    for (auto& [k, v] : kvs)
      if (!cur.key(k) || !cur.val(v))
        return step::need_more;
    for (auto& [k, v] : kvs) {
      assign(k, std::move(v));
      key_changed(k, out);
    }
    return answer();
  }
  case op::cancel_wait:
    cancel_wait(c, cn);
    reply.push_back(wait_canceled);
    return answer();
  case op::queue_push: {
    std::string k, v;
    if (!cur.key(k) || !cur.val(v))
      return step::need_more;
    charge(k.size() + v.size(), 1, k);
    queues_[k].push_back(std::move(v));
    queue_pushed(k, out);
    return answer();
  }
  case op::queue_pop: {
    std::string k;
    if (!cur.key(k))
      return step::need_more;
    auto it = queues_.find(k);
    int64_t size = it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
    put<int64_t>(reply, size);
    if (size > 0) {
      put_bytes(reply, it->second.front());
      bytes_ -= k.size() + it->second.front().size();
      --items_;
      it->second.pop_front();
      if (it->second.empty())
        queues_.erase(it);
    }
    return answer();
  }
  case op::queue_len: {
    std::string k;
    if (!cur.key(k))
      return step::need_more;
    auto it = queues_.find(k);
    put<int64_t>(reply, it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
    return answer();
  }
  case op::list_keys:
    put<int64_t>(reply, static_cast<int64_t>(data_.size()));
    for (auto& [k, v] : data_)
      put_bytes(reply, k);
    return answer();
  case op::barrier: {
    std::string k;
    int64_t world = 0;
    if (!cur.key(k) || !cur.value(world))
      return step::need_more;
    int64_t count = 0;
    if (auto it = data_.find(k); it != data_.end() && !parse_int64(it->second, count))
      throw protocol_error(fmt::format("BARRIER on key '{}', whose value is not a number", k));
    if (__builtin_add_overflow(count, 1, &count))
      throw protocol_error(fmt::format("BARRIER on key '{}' overflows int64", k));
    assign(k, std::to_string(count));
    if (count >= world) {
      key_changed(k, out); // releases the members that arrived before
      reply.push_back(stop_waiting);
      return answer();
    }
    cancel_wait(c, cn);
    cn.waiting = true;
    cn.awaiting = {k};
    waiters_[k].push_back(c);
    return step::done;
  }
  case op::validate:
  case op::unknown:
    break;
  }
  return step::fail;
}

// A WAIT (or a GET's preceding WAIT) is answered at once when every key is there,
// otherwise when the last missing one is set. A new WAIT replaces a pending one: torch
// 1.13's client gives up on a wait without telling the server, and a stale answer
// arriving later would be read as the reply to its next query.
void torch_store_core::wait_for(conn_id c, connection& cn, const std::vector<std::string>& keys,
                                result& out) {
  cancel_wait(c, cn);
  std::set<std::string> missing;
  for (auto& k : keys)
    if (!present(k))
      missing.insert(k);
  if (missing.empty()) {
    out.sends.push_back({c, std::string(1, stop_waiting)});
    return;
  }
  for (auto& k : missing)
    waiters_[k].push_back(c);
  cn.awaiting = std::move(missing);
  cn.waiting = true;
}

void torch_store_core::key_changed(const std::string& key, result& out) {
  auto w = waiters_.find(key);
  if (w == waiters_.end())
    return;
  auto list = std::move(w->second);
  waiters_.erase(w);
  for (auto c : list) {
    auto it = conns_.find(c);
    if (it == conns_.end() || !it->second.waiting)
      continue;
    auto& cn = it->second;
    cn.awaiting.erase(key);
    if (cn.awaiting.empty()) {
      cn.waiting = false;
      out.sends.push_back({c, std::string(1, stop_waiting)});
    }
  }
}

// One pushed item wakes one waiter (the first whose only missing key is this queue), so
// two blocking pops never race for one item.
void torch_store_core::queue_pushed(const std::string& key, result& out) {
  auto w = waiters_.find(key);
  if (w == waiters_.end())
    return;
  auto& list = w->second;
  for (auto i = list.begin(); i != list.end(); ++i) {
    auto it = conns_.find(*i);
    if (it == conns_.end() || !it->second.waiting || it->second.awaiting.size() != 1)
      continue;
    auto c = *i;
    list.erase(i);
    if (list.empty())
      waiters_.erase(w);
    it->second.awaiting.clear();
    it->second.waiting = false;
    out.sends.push_back({c, std::string(1, stop_waiting)});
    return;
  }
}

void torch_store_core::cancel_wait(conn_id c, connection& cn) {
  if (!cn.waiting)
    return;
  for (auto& k : cn.awaiting) {
    auto w = waiters_.find(k);
    if (w == waiters_.end())
      continue;
    auto& list = w->second;
    list.erase(std::remove(list.begin(), list.end(), c), list.end());
    if (list.empty())
      waiters_.erase(w);
  }
  cn.awaiting.clear();
  cn.waiting = false;
}

} // namespace cafhvd
