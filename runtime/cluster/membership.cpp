// The membership table and how `caf-hvd status` shows it.
#include "runtime/cluster/membership.hpp"
#include "runtime/network/nic.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/observe/text.hpp"

namespace cafhvd {

namespace {

bool key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'
         || c == '/';
}

bool value_char(char c) { return key_char(c) || c == ':' || c == '+' || c == '@'; }

uint32_t ranks_of(const member_info& m) {
  uint32_t n = 0;
  for (auto& j : m.jobs)
    n += j.ranks;
  return n;
}

size_t gpus_held(const member_info& m) { return m.gpus.size() - std::min(m.gpus.size(), m.gpus_free.size()); }

std::string ago(int64_t now, int64_t then) {
  if (then <= 0)
    return "-";
  double s = static_cast<double>(std::max<int64_t>(0, now - then)) / 1000.0;
  if (s < 60)
    return fmt::format("{:.1f}s ago", s);
  if (s < 3600)
    return fmt::format("{}m{:02}s ago", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt::format("{}h{:02}m ago", static_cast<int>(s) / 3600,
                     (static_cast<int>(s) % 3600) / 60);
}

// Columns padded to their widest cell.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i)
        width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::string out;
  for (auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i)
      line += i + 1 == r.size() ? r[i] : fmt::format("{:<{}}  ", r[i], width[i]);
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    out += line + "\n";
  }
  return out;
}

} // namespace

void node_book::set_capacity(uint32_t slots) {
  std::lock_guard g{m_};
  capacity_ = slots;
}

uint32_t node_book::capacity() const {
  std::lock_guard g{m_};
  return capacity_;
}

void node_book::open(uint64_t colocator, job_summary job) {
  {
    std::lock_guard g{m_};
    job.ranks = 0;
    jobs_[colocator] = std::move(job);
  }
  changed();
}

void node_book::close(uint64_t colocator) {
  {
    std::lock_guard g{m_};
    jobs_.erase(colocator);
    for (auto it = held_.begin(); it != held_.end();)
      if (it->second == colocator)
        it = held_.erase(it);
      else
        ++it;
  }
  changed();
}

std::vector<uint32_t> node_book::take(uint64_t colocator, uint32_t n, std::string& why) {
  auto out = take_locked(colocator, n, why);
  if (!out.empty())
    changed();
  return out;
}

std::vector<uint32_t> node_book::take_locked(uint64_t colocator, uint32_t n, std::string& why) {
  std::lock_guard g{m_};
  auto job = jobs_.find(colocator);
  if (job == jobs_.end()) {
    why = "the job is not open on this node";
    return {};
  }
  if (capacity_ > 0 && held_.size() + n > capacity_) {
    std::map<std::string, uint32_t> by_job;
    for (auto& [index, owner] : held_)
      if (auto it = jobs_.find(owner); it != jobs_.end())
        ++by_job[it->second.job];
    std::vector<std::string> holders;
    for (auto& [id, count] : by_job)
      holders.push_back(fmt::format("{} by job {}", count, id));
    static_assert(node_full_words == " for all jobs and ");
    why = fmt::format("the node has {} slot{} for all jobs and {} {} held ({}); {} more do not "
                      "fit",
                      capacity_, capacity_ == 1 ? "" : "s", held_.size(),
                      held_.size() == 1 ? "is" : "are", fmt::join(holders, ", "), n);
    return {};
  }
  std::vector<uint32_t> out;
  for (uint32_t i = 0; out.size() < n; ++i)
    if (!held_.count(i)) {
      held_[i] = colocator;
      out.push_back(i);
    }
  job->second.ranks += n;
  return out;
}

void node_book::give_back(uint64_t colocator, uint32_t index) {
  {
    std::lock_guard g{m_};
    auto it = held_.find(index);
    if (it == held_.end() || it->second != colocator)
      return;
    held_.erase(it);
    if (auto j = jobs_.find(colocator); j != jobs_.end() && j->second.ranks > 0)
      --j->second.ranks;
  }
  changed();
}

bool node_book::fits_once_own_end(uint64_t colocator, uint32_t n, uint32_t ending) const {
  std::lock_guard g{m_};
  if (capacity_ == 0)
    return false;
  size_t own = 0;
  for (auto& [index, owner] : held_)
    own += owner == colocator;
  own = std::min<size_t>(own, ending);
  return own > 0 && held_.size() - own + n <= capacity_;
}

void node_book::set_gpus(uint64_t colocator, std::vector<int32_t> devices) {
  {
    std::lock_guard g{m_};
    if (auto it = jobs_.find(colocator); it != jobs_.end())
      it->second.gpus = std::move(devices);
  }
  changed();
}

void node_book::on_change(std::function<void()> f) {
  std::lock_guard g{m_};
  on_change_ = std::move(f);
}

void node_book::changed() const {
  std::function<void()> f;
  {
    std::lock_guard g{m_};
    f = on_change_;
  }
  if (f)
    f();
}

std::vector<job_summary> node_book::snapshot() const {
  std::lock_guard g{m_};
  std::vector<job_summary> out;
  for (auto& [id, j] : jobs_)
    out.push_back(j);
  return out;
}

const std::string& placed_host::reach(const std::string& table_host) const {
  return holder && !is_loopback_address(table_host) ? table_host : address;
}

std::vector<std::string> parse_labels(const std::vector<std::string>& given) {
  std::map<std::string, std::string> out;
  for (auto& l : given) {
    auto eq = l.find('=');
    auto key = l.substr(0, eq);
    if (eq == std::string::npos || key.empty() || key.size() > 63
        || !std::all_of(key.begin(), key.end(), key_char))
      throw std::invalid_argument(fmt::format(
          "--label '{}': give KEY=VALUE, the key 1 to 63 letters, digits, '.', '-', '_' or '/'",
          printable(l)));
    auto value = l.substr(eq + 1);
    if (value.size() > 253 || !std::all_of(value.begin(), value.end(), value_char))
      throw std::invalid_argument(
          fmt::format("--label '{}': the value may have up to 253 letters, digits and "
                      "'.-_/:+@' (no spaces, no '=' or ',')",
                      printable(l)));
    if (!out.emplace(key, value).second)
      throw std::invalid_argument(fmt::format("--label '{}': the key '{}' is given twice",
                                              printable(l), key));
  }
  std::vector<std::string> v;
  for (auto& [k, val] : out)
    v.push_back(k + "=" + val);
  return v;
}

cluster_address parse_cluster_address(std::string_view text, uint16_t default_port) {
  cluster_address a;
  auto colon = text.rfind(':');
  auto host = text.substr(0, colon);
  if (host.empty() || !std::all_of(host.begin(), host.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
      }))
    throw std::invalid_argument("give HOST or HOST:PORT (a host name or IPv4 address)");
  a.host = std::string{host};
  a.port = default_port;
  if (colon != std::string_view::npos) {
    auto port = text.substr(colon + 1);
    unsigned long p = 0;
    if (port.empty() || port.size() > 5
        || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })
        || (p = std::stoul(std::string{port})) == 0 || p > 65535)
      throw std::invalid_argument(
          fmt::format("'{}' is not a port (1 to 65535)", printable(port)));
    a.port = static_cast<uint16_t>(p);
  }
  return a;
}

std::string membership_table::join(uint64_t member, const member_info& info,
                                   const ticket_holder& holder, int64_t now_ms) {
  if (!valid_host_name(info.name))
    return fmt::format("'{}' is not a node name (1 to 255 letters, digits, '.', '-' or '_')",
                       printable(info.name));
  if (!holder.shared && holder.name != info.name)
    return fmt::format("its certificate was issued for '{}', so it cannot join as '{}'",
                       printable(holder.name), printable(info.name));
  if (auto it = rows_.find(info.name); it != rows_.end()) {
    auto& e = it->second;
    if (e.member != member && e.row.state == "alive")
      return fmt::format("the name '{}' is held by a live agent at {}:{}; give this "
                         "agent another --name, or stop that one",
                         printable(info.name), printable(e.row.info.address), e.row.info.port);
  }
  // One row per member: a member that joined under another name before gives it up.
  for (auto it = rows_.begin(); it != rows_.end();)
    if (it->second.member == member && it->first != info.name)
      it = rows_.erase(it);
    else
      ++it;
  auto& e = rows_[info.name];
  e.member = member;
  e.row.info = info; // (drained stays: a drained node that comes back is still drained)
  e.row.state = "alive";
  e.row.certificate = holder.name;
  e.row.shared = holder.shared;
  e.row.joined_ms = now_ms;
  e.row.last_seen_ms = now_ms;
  e.row.gone_ms = 0;
  return {};
}

bool membership_table::update(uint64_t member, const member_info& info, int64_t now_ms) {
  auto it = rows_.find(info.name);
  if (it == rows_.end() || it->second.member != member || it->second.row.state != "alive")
    return false;
  it->second.row.info = info;
  it->second.row.last_seen_ms = now_ms;
  return true;
}

std::vector<std::string> membership_table::gone(uint64_t member, bool left, int64_t now_ms) {
  std::vector<std::string> names;
  for (auto& [name, e] : rows_)
    if (e.member == member && e.row.state == "alive") {
      names.push_back(name);
      e.row.state = left ? "left" : "lost";
      e.row.gone_ms = now_ms;
      e.row.info.jobs.clear(); // its ranks are gone with it (or will be: its jobs see it too)
    }
  return names;
}

void membership_table::expire(int64_t now_ms, int64_t keep_ms) {
  for (auto it = rows_.begin(); it != rows_.end();)
    if (it->second.row.state != "alive" && now_ms - it->second.row.gone_ms > keep_ms)
      it = rows_.erase(it);
    else
      ++it;
  settle(now_ms, 5000); // holds that ran out or whose ranks run, jobs that stopped asking
}

std::string membership_table::set_drained(const std::string& name, bool drained) {
  auto it = rows_.find(name);
  if (it == rows_.end()) {
    std::vector<std::string> names;
    for (auto& [n, e] : rows_)
      names.push_back(n);
    return fmt::format("no node named '{}' in the cluster (its nodes: {})", printable(name),
                       names.empty() ? std::string{"none"} : fmt::format("{}", fmt::join(names, ", ")));
  }
  it->second.row.drained = drained;
  it->second.undrained = !drained;
  // The node is told to undrain: until its next report says otherwise (it refused), it
  // counts as undrained, so status does not show it drained after the undrain.
  if (!drained)
    it->second.row.info.draining = false;
  return {};
}

bool membership_table::drained(const std::string& name) const {
  auto it = rows_.find(name);
  return it != rows_.end() && it->second.row.drained;
}

bool membership_table::undrained(const std::string& name) const {
  auto it = rows_.find(name);
  return it != rows_.end() && it->second.undrained;
}

std::optional<uint64_t> membership_table::member_of(const std::string& name) const {
  auto it = rows_.find(name);
  if (it == rows_.end() || it->second.row.state != "alive")
    return std::nullopt;
  return it->second.member;
}

cluster_view membership_table::view(int64_t now_ms) const {
  cluster_view v;
  v.now_ms = now_ms;
  for (auto& [name, e] : rows_)
    v.nodes.push_back(e.row);
  for (auto& a : queue_)
    v.waiting.push_back(job_summary{a.job, a.owner, a.request.np, {}, a.first_ms});
  for (auto& [job, h] : held_) {
    if (now_ms > h.until_ms)
      continue; // ran out (let go at the next settle)
    uint32_t n = 0;
    for (auto& [node, k] : h.slots) {
      // held until k of its ranks run there: those running already are not held
      uint32_t running = 0;
      if (auto row = rows_.find(node); row != rows_.end())
        for (auto& j : row->second.row.info.jobs)
          if (j.job == job)
            running = j.ranks;
      n += k > running ? k - running : 0;
    }
    if (n > 0)
      v.placed.push_back(job_summary{job, h.owner, n, {}, h.since_ms});
  }
  return v;
}

size_t membership_table::alive() const {
  return static_cast<size_t>(std::count_if(rows_.begin(), rows_.end(),
                                           [](auto& p) { return p.second.row.state == "alive"; }));
}

namespace {

bool has_labels(const member_info& m, const std::vector<std::string>& wanted) {
  return std::all_of(wanted.begin(), wanted.end(), [&](auto& l) {
    return std::find(m.labels.begin(), m.labels.end(), l) != m.labels.end();
  });
}

// What placement may give of a node: its --slots, else one slot per processor (at most
// 65,536 either way: a node's word, not a way to take every job).
uint64_t capacity_of(const member_info& m) {
  return std::min<uint64_t>(65536, m.slots ? m.slots : std::max(1u, m.cpus));
}

} // namespace

void membership_table::settle(int64_t now_ms, int64_t forget_ms) {
  // Held slots the agents now report as the job's, or whose hold ran out, are let go.
  for (auto it = held_.begin(); it != held_.end();) {
    auto& h = it->second;
    for (auto n = h.slots.begin(); n != h.slots.end();) {
      auto row = rows_.find(n->first);
      bool reported = false;
      if (row != rows_.end())
        for (auto& j : row->second.row.info.jobs)
          if (j.job == it->first && j.ranks >= n->second)
            reported = true;
      // (a node that has not joined a restarted table again yet keeps its holds while the
      // table waits for it)
      bool away = row == rows_.end() ? rejoining(now_ms).empty()
                                     : row->second.row.state != "alive";
      if (reported || away)
        n = h.slots.erase(n);
      else
        ++n;
    }
    if (h.slots.empty() || now_ms > h.until_ms)
      it = held_.erase(it);
    else
      ++it;
  }
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](auto& q) { return now_ms - q.last_ms > forget_ms; }),
               queue_.end());
  for (auto it = needs_.begin(); it != needs_.end();) {
    bool known = held_.count(it->first) > 0
                 || std::any_of(queue_.begin(), queue_.end(),
                                [&](auto& q) { return q.job == it->first; });
    for (auto r = rows_.begin(); !known && r != rows_.end(); ++r)
      for (auto& j : r->second.row.info.jobs)
        known = known || j.job == it->first;
    it = known ? std::next(it) : needs_.erase(it);
  }
}

membership_table::fit membership_table::fit_of(const std::string& name, const member_row& row,
                                               const std::string& job, uint32_t cpus_per_slot,
                                               uint32_t gpus_per_slot,
                                               std::map<std::string, uint64_t>* holders) const {
  auto& m = row.info;
  auto need = [&](const std::string& j) {
    auto it = needs_.find(j);
    return it == needs_.end() ? std::pair<uint32_t, uint32_t>{1, 0} : it->second;
  };
  uint64_t used = 0, cpus_used = 0, gpus_held = 0, own_gpus = 0;
  for (auto& j : m.jobs) {
    if (j.job == job) { // its own ranks are its own, and so are the devices lent to it
      own_gpus = j.gpus.size();
      continue;
    }
    used += j.ranks;
    cpus_used += uint64_t{j.ranks} * std::max(1u, need(j.job).first);
    if (holders)
      (*holders)[j.job] += j.ranks;
  }
  for (auto& [held_job, h] : held_) {
    if (held_job == job)
      continue;
    auto n = h.slots.find(name);
    if (n == h.slots.end())
      continue;
    // held for it, less what its ranks there already hold (counted above)
    uint32_t running = 0;
    for (auto& j : m.jobs)
      if (j.job == held_job)
        running = j.ranks;
    uint64_t extra = n->second > running ? n->second - running : 0;
    used += extra;
    cpus_used += extra * std::max(1u, need(held_job).first);
    gpus_held += extra * need(held_job).second; // not lent by the node yet
    if (holders)
      (*holders)[held_job] += extra;
  }
  fit f;
  auto cap = capacity_of(m);
  f.used = used;
  f.free = static_cast<uint32_t>(used >= cap ? 0 : cap - used);
  uint64_t fits = f.free;
  if (cpus_per_slot > 0) {
    uint64_t cpus = std::max(1u, m.cpus);
    fits = std::min(fits, (cpus_used >= cpus ? 0 : cpus - cpus_used) / cpus_per_slot);
  }
  if (gpus_per_slot > 0) {
    uint64_t gpus = m.gpus_free.size() + own_gpus;
    fits = std::min(fits, (gpus_held >= gpus ? 0 : gpus - gpus_held) / gpus_per_slot);
  }
  f.fits = static_cast<uint32_t>(fits);
  return f;
}

namespace {

// What a node could give one job if it ran nothing else.
uint64_t most_of(const member_info& m, uint32_t cpus_per_slot, uint32_t gpus_per_slot) {
  uint64_t n = capacity_of(m);
  if (cpus_per_slot > 0)
    n = std::min<uint64_t>(n, std::max(1u, m.cpus) / cpus_per_slot);
  if (gpus_per_slot > 0)
    n = std::min<uint64_t>(n, m.gpus.size() / gpus_per_slot);
  return n;
}

// " (2 CPUs and 1 GPU each)", or "" for a rank that needs only its slot.
std::string needs_text(uint32_t cpus, uint32_t gpus) {
  std::vector<std::string> parts;
  if (cpus)
    parts.push_back(fmt::format("{} CPU{}", cpus, cpus == 1 ? "" : "s"));
  if (gpus)
    parts.push_back(fmt::format("{} GPU{}", gpus, gpus == 1 ? "" : "s"));
  return parts.empty() ? std::string{} : fmt::format(" ({} each)", fmt::join(parts, " and "));
}

} // namespace

placement membership_table::place(const placement_request& r, int64_t now_ms,
                                  const std::string& owner, int64_t forget_ms) {
  settle(now_ms, forget_ms);
  placement p;
  if (r.np == 0) {
    p.error = "a job needs at least 1 rank";
    return p;
  }
  if (auto it = held_.find(r.job); it != held_.end()) {
    if (it->second.owner != owner) {
      p.error = fmt::format("job id {} is another owner's", printable(r.job));
      return p;
    }
    return it->second.answer; // asked again after it was placed: the same answer
  }
  for (auto& q : queue_)
    if (q.job == r.job && q.owner != owner) {
      p.error = fmt::format("job id {} is another owner's", printable(r.job));
      return p;
    }
  // Free slots per matching node: capacity less what its agent reports and what is held
  // for jobs placed but not running there yet; of those, what a rank's CPUs and GPUs fit.
  struct cand {
    std::string name;
    const member_row* row;
    uint32_t free;
  };
  std::vector<cand> nodes;
  uint64_t capacity = 0, free = 0;
  std::map<std::string, uint64_t> holders; // job -> slots it holds on matching nodes
  bool needs = r.cpus_per_slot > 0 || r.gpus_per_slot > 0;
  for (auto& [name, e] : rows_) {
    auto& m = e.row.info;
    if (e.row.state != "alive" || m.draining || e.row.drained || !has_labels(m, r.labels))
      continue;
    auto f = fit_of(name, e.row, r.job, r.cpus_per_slot, r.gpus_per_slot, &holders);
    capacity += needs ? most_of(m, r.cpus_per_slot, r.gpus_per_slot) : capacity_of(m);
    free += f.fits;
    nodes.push_back({name, &e.row, f.fits});
  }
  auto label_text = r.labels.empty() ? std::string{}
                                     : fmt::format(" labelled {}", fmt::join(r.labels, ","));
  auto each = needs_text(r.cpus_per_slot, r.gpus_per_slot);
  if (auto why = rejoining(now_ms); !why.empty() && (nodes.empty() || r.np > capacity)) {
    p.waiting = true;
    p.waiting_for = fmt::format("{} slot{}{}{}: {}", r.np, r.np == 1 ? "" : "s", each,
                                label_text, why);
    return p;
  }
  if (nodes.empty()) {
    p.error = fmt::format("the cluster has no live node{} to place on", label_text);
    return p;
  }
  if (r.np > capacity) {
    p.error = needs ? fmt::format("the cluster's live nodes{} fit {} rank{}{} in all; -np {} "
                                  "cannot fit",
                                  label_text, capacity, capacity == 1 ? "" : "s", each, r.np)
                    : fmt::format("the cluster's live nodes{} have {} slot{} in all; -np {} "
                                  "cannot fit",
                                  label_text, capacity, capacity == 1 ? "" : "s", r.np);
    return p;
  }
  needs_[r.job] = {r.cpus_per_slot, r.gpus_per_slot};
  // First come, first served: a job waits behind those that asked before it.
  auto q = std::find_if(queue_.begin(), queue_.end(), [&](auto& a) { return a.job == r.job; });
  if (q == queue_.end())
    q = queue_.insert(queue_.end(), asked{r.job, owner, now_ms, r, now_ms});
  q->last_ms = now_ms;
  auto ahead = static_cast<size_t>(q - queue_.begin());
  if (free < r.np || ahead > 0) {
    std::vector<std::string> who;
    for (auto& [job, n] : holders)
      if (n > 0)
        who.push_back(fmt::format("{} held by job {}", n, job));
    p.waiting = true;
    p.waiting_for = fmt::format("{} slot{}{}{}: {} free of {}{}{}", r.np, r.np == 1 ? "" : "s",
                                each, label_text, free, capacity,
                                who.empty() ? "" : ", " + fmt::format("{}", fmt::join(who, ", ")),
                                ahead ? fmt::format(", {} job{} asked first", ahead,
                                                    ahead == 1 ? "" : "s")
                                      : "");
    return p;
  }
  // Packed: the fullest-free nodes first, so the job spans as few as possible; spread:
  // one rank per node in turn. Ties by name, so the same table gives the same answer.
  std::sort(nodes.begin(), nodes.end(), [](auto& a, auto& b) {
    return a.free != b.free ? a.free > b.free : a.name < b.name;
  });
  std::map<std::string, uint32_t> take;
  uint32_t left = r.np;
  if (r.spread) {
    while (left > 0)
      for (auto& n : nodes)
        if (left > 0 && take[n.name] < n.free) {
          ++take[n.name];
          --left;
        }
  } else {
    for (auto& n : nodes) {
      auto k = std::min(left, n.free);
      if (k)
        take[n.name] = k;
      left -= k;
    }
  }
  held h;
  h.owner = owner;
  h.until_ms = now_ms + r.hold_ms;
  h.since_ms = now_ms;
  for (auto& n : nodes)
    if (auto it = take.find(n.name); it != take.end() && it->second > 0) {
      p.hosts.push_back({n.name, n.row->info.address, n.row->info.port, it->second, false});
      h.slots[n.name] = it->second;
    }
  h.answer = p;
  held_[r.job] = std::move(h);
  queue_.erase(q);
  return p;
}

void membership_table::rejoin_until(int64_t until_ms, int64_t started_ms,
                                    std::vector<std::string> expected) {
  rejoin_until_ms_ = until_ms;
  started_ms_ = started_ms;
  expected_ = std::move(expected);
}

namespace {

nlohmann::json request_json(const placement_request& r) {
  return {{"job", r.job},         {"np", r.np},
          {"spread", r.spread},   {"labels", r.labels},
          {"hold_ms", r.hold_ms}, {"cpus_per_slot", r.cpus_per_slot},
          {"gpus_per_slot", r.gpus_per_slot}};
}

placement_request request_of(const nlohmann::json& j) {
  placement_request r;
  r.job = j.at("job").get<std::string>();
  r.np = j.at("np").get<uint32_t>();
  r.spread = j.at("spread").get<bool>();
  r.labels = j.at("labels").get<std::vector<std::string>>();
  r.hold_ms = j.at("hold_ms").get<uint32_t>();
  r.cpus_per_slot = j.at("cpus_per_slot").get<uint32_t>();
  r.gpus_per_slot = j.at("gpus_per_slot").get<uint32_t>();
  return r;
}

} // namespace

std::string membership_table::placements_text() const {
  auto held = nlohmann::json::array();
  for (auto& [job, h] : held_) {
    if (h.growth)
      continue; // a few seconds' hold: the job asks again the restarted table
    auto hosts = nlohmann::json::array();
    for (auto& p : h.answer.hosts)
      hosts.push_back({{"name", p.name},
                       {"address", p.address},
                       {"port", p.port},
                       {"slots", p.slots},
                       {"holder", p.holder}});
    auto need = needs_.find(job);
    held.push_back({{"job", job},
                    {"owner", h.owner},
                    {"slots", h.slots},
                    {"until_ms", h.until_ms},
                    {"since_ms", h.since_ms},
                    {"hosts", hosts},
                    {"needs", need == needs_.end() ? std::vector<uint32_t>{0, 0}
                                                   : std::vector<uint32_t>{need->second.first,
                                                                           need->second.second}}});
  }
  auto queue = nlohmann::json::array();
  for (auto& a : queue_)
    queue.push_back({{"owner", a.owner}, {"first_ms", a.first_ms}, {"request", request_json(a.request)}});
  return nlohmann::json{{"held", held}, {"queue", queue}}.dump() + "\n";
}

void membership_table::restore_placements(const std::string& text, int64_t now_ms) {
  try {
    auto j = nlohmann::json::parse(text);
    for (auto& e : j.at("held")) {
      held h;
      h.owner = e.at("owner").get<std::string>();
      h.slots = e.at("slots").get<std::map<std::string, uint32_t>>();
      h.until_ms = e.at("until_ms").get<int64_t>();
      h.since_ms = e.at("since_ms").get<int64_t>();
      for (auto& p : e.at("hosts"))
        h.answer.hosts.push_back({p.at("name").get<std::string>(),
                                  p.at("address").get<std::string>(), p.at("port").get<uint16_t>(),
                                  p.at("slots").get<uint32_t>(), p.at("holder").get<bool>()});
      auto need = e.at("needs").get<std::vector<uint32_t>>();
      auto job = e.at("job").get<std::string>();
      if (need.size() == 2)
        needs_[job] = {need[0], need[1]};
      if (h.until_ms > now_ms)
        held_[job] = std::move(h);
    }
    for (auto& e : j.at("queue")) {
      asked a;
      a.request = request_of(e.at("request"));
      a.job = a.request.job;
      a.owner = e.at("owner").get<std::string>();
      a.first_ms = e.at("first_ms").get<int64_t>();
      a.last_ms = now_ms; // its driver asks again once it reaches the new table
      queue_.push_back(std::move(a));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("not a record of the table's placements: {}", e.what()));
  }
}

std::string membership_table::rejoining(int64_t now_ms) const {
  if (now_ms >= rejoin_until_ms_)
    return {};
  std::vector<std::string> missing;
  for (auto& name : expected_)
    if (auto it = rows_.find(name); it == rows_.end() || it->second.row.state != "alive")
      missing.push_back(name);
  if (missing.empty())
    return {};
  return fmt::format("the cluster's table restarted {:.1f} s ago and waits up to {:.0f} s for "
                     "its members to join again: {} of {} have (not yet: {})",
                     static_cast<double>(now_ms - started_ms_) / 1000.0,
                     static_cast<double>(rejoin_until_ms_ - started_ms_) / 1000.0,
                     expected_.size() - missing.size(), expected_.size(),
                     fmt::join(missing, ", "));
}

std::vector<std::string> membership_table::member_names() const {
  // (a lost member counts: the table's own agent stopping breaks every member's link)
  std::vector<std::string> names;
  for (auto& [name, e] : rows_)
    if (e.row.state != "left")
      names.push_back(name);
  return names;
}

std::vector<placed_host> membership_table::available(const placement_request& r,
                                                     int64_t now_ms) {
  settle(now_ms, 5000);
  needs_[r.job] = {r.cpus_per_slot, r.gpus_per_slot};
  // Slots jobs waiting in line need, taken from the nodes they could use, in name order:
  // this job may not grow into those.
  std::map<std::string, uint64_t> promised;
  for (auto& q : queue_) {
    if (q.job == r.job)
      continue;
    uint64_t want = q.request.np;
    for (auto& [name, e] : rows_) {
      auto& m = e.row.info;
      if (want == 0)
        break;
      if (e.row.state != "alive" || m.draining || e.row.drained
          || !has_labels(m, q.request.labels))
        continue;
      auto f = fit_of(name, e.row, q.job, q.request.cpus_per_slot, q.request.gpus_per_slot);
      uint64_t spare = f.fits > promised[name] ? f.fits - promised[name] : 0;
      auto k = std::min(want, spare);
      promised[name] += k;
      want -= k;
    }
  }
  std::vector<placed_host> out;
  for (auto& [name, e] : rows_) {
    auto& m = e.row.info;
    if (e.row.state != "alive" || m.draining || e.row.drained || !has_labels(m, r.labels))
      continue;
    // What this job may use there: its own ranks' slots count as its own.
    auto f = fit_of(name, e.row, r.job, r.cpus_per_slot, r.gpus_per_slot);
    uint32_t own = 0;
    for (auto& j : m.jobs)
      if (j.job == r.job)
        own = j.ranks;
    uint64_t fits = f.fits;
    if (auto p = promised.find(name); p != promised.end() && fits > own)
      fits = std::max<uint64_t>(own, fits > p->second ? fits - p->second : 0);
    if (fits > 0)
      out.push_back({name, m.address, m.port, static_cast<uint32_t>(fits), false});
  }
  return out;
}

void membership_table::hold_growth(const placement_request& r,
                                   const std::vector<placed_host>& hosts, int64_t now_ms,
                                   const std::string& owner, int64_t hold_ms) {
  auto it = held_.find(r.job);
  if (it != held_.end() && !it->second.growth)
    return; // placed: its own hold stands
  std::map<std::string, uint32_t> own;
  uint64_t own_total = 0;
  for (auto& [name, e] : rows_)
    for (auto& j : e.row.info.jobs)
      if (j.job == r.job) {
        own[name] = j.ranks;
        own_total += j.ranks;
      }
  uint64_t want = r.np == 0 ? UINT64_MAX : (r.np > own_total ? r.np - own_total : 0);
  held h;
  h.owner = owner;
  h.growth = true;
  h.since_ms = now_ms;
  h.until_ms = now_ms + hold_ms;
  for (auto& host : hosts) {
    auto mine = own[host.name];
    if (want == 0 || host.slots <= mine)
      continue;
    auto take = std::min<uint64_t>(want, host.slots - mine);
    h.slots[host.name] = static_cast<uint32_t>(mine + take); // held until that many run
    want -= take;
  }
  if (h.slots.empty()) {
    if (it != held_.end())
      held_.erase(it);
    return;
  }
  held_[r.job] = std::move(h);
}

void membership_table::release(const std::string& job, const std::string& owner) {
  if (auto it = held_.find(job); it != held_.end() && it->second.owner == owner)
    held_.erase(it);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](auto& q) { return q.job == job && q.owner == owner; }),
               queue_.end());
}

std::string render_status(const cluster_view& v) {
  size_t alive = 0;
  uint32_t slots = 0, used = 0;
  bool unlimited = false;
  for (auto& n : v.nodes)
    if (n.state == "alive") {
      ++alive;
      slots += n.info.slots;
      unlimited |= n.info.slots == 0;
      used += ranks_of(n.info);
    }
  std::string out = fmt::format(
      "cluster held by '{}': {} node{} alive, {} slot{} in use of {}\n", printable(v.holder), alive,
      alive == 1 ? "" : "s", used, used == 1 ? "" : "s",
      unlimited ? (slots ? fmt::format("{} and unlimited", slots) : std::string{"unlimited"})
                : fmt::format("{}", slots));
  std::vector<std::vector<std::string>> rows{
      {"NODE", "STATE", "ADDRESS", "SLOTS", "GPUS", "LABELS", "JOINED", "LAST SEEN"}};
  for (auto& n : v.nodes) {
    auto state = n.state;
    if (n.state == "alive" && (n.info.draining || n.drained))
      state = ranks_of(n.info) > 0 ? "draining" : "drained";
    if (n.shared)
      state += " (shared cert)";
    rows.push_back(
        {printable(n.info.name), state,
         fmt::format("{}:{}", printable(n.info.address), n.info.port),
         n.info.slots ? fmt::format("{}/{} used", ranks_of(n.info), n.info.slots)
                      : fmt::format("{} used, no limit", ranks_of(n.info)),
         n.info.gpus.empty() ? std::string{"-"}
                             : fmt::format("{}/{} used", gpus_held(n.info), n.info.gpus.size()),
         n.info.labels.empty() ? std::string{"-"} : printable(fmt::format("{}", fmt::join(n.info.labels, ","))),
         ago(v.now_ms, n.joined_ms),
         n.state == "alive" ? ago(v.now_ms, n.last_seen_ms)
                            : fmt::format("{} {}", n.state, ago(v.now_ms, n.gone_ms))});
  }
  out += table(rows);
  // What each agent refused, per peer: a peer that breaks the wire's rules or sends
  // messages it has no right to (docs/security.md)
  std::vector<std::vector<std::string>> refused{
      {"REFUSED BY", "PEER", "CONNECTIONS", "MESSAGES"}};
  for (auto& n : v.nodes) {
    std::map<std::string, std::pair<uint64_t, uint64_t>> per_peer;
    for (auto& [peer, count] : n.info.refused_connections)
      per_peer[peer].first = count;
    for (auto& [peer, count] : n.info.refused_messages)
      per_peer[peer].second = count;
    for (auto& [peer, counts] : per_peer)
      refused.push_back({printable(n.info.name), printable(peer), std::to_string(counts.first),
                         std::to_string(counts.second)});
  }
  if (refused.size() > 1)
    out += table(refused);
  return out + render_jobs(v);
}

namespace {

// Every job the view knows: running (from every node's report: where each one's ranks
// run), starting (slots held for ranks not started yet) and waiting in line.
struct job_row {
  std::string owner;
  int64_t since = 0;
  uint32_t ranks = 0, held = 0, asked = 0;
  std::vector<std::pair<std::string, uint32_t>> where;
  std::string state() const {
    if (asked)
      return fmt::format("waiting for {} slot{}", asked, asked == 1 ? "" : "s");
    if (held && ranks)
      return fmt::format("running ({} more slot{} held: it grows)", held, held == 1 ? "" : "s");
    if (held)
      return fmt::format("starting ({} slot{} held)", held, held == 1 ? "" : "s");
    return "running";
  }
};

std::map<std::string, job_row> jobs_of(const cluster_view& v) {
  std::map<std::string, job_row> jobs;
  auto since = [](job_row& r, int64_t ms) { r.since = r.since ? std::min(r.since, ms) : ms; };
  for (auto& n : v.nodes)
    for (auto& j : n.info.jobs) {
      auto& r = jobs[j.job];
      r.owner = j.owner;
      since(r, j.since_ms);
      r.ranks += j.ranks;
      r.where.emplace_back(n.info.name, j.ranks);
    }
  for (auto& j : v.placed) {
    auto& r = jobs[j.job];
    r.owner = j.owner;
    since(r, j.since_ms);
    r.held += j.ranks;
  }
  for (auto& j : v.waiting) {
    auto& r = jobs[j.job];
    r.owner = j.owner;
    since(r, j.since_ms);
    r.asked = j.ranks;
  }
  return jobs;
}

} // namespace

std::string render_jobs(const cluster_view& v) {
  auto jobs = jobs_of(v);
  if (jobs.empty())
    return "no jobs running\n";
  std::vector<std::vector<std::string>> jr{{"JOB", "OWNER", "RANKS", "WHERE", "SINCE", "STATE"}};
  for (auto& [id, r] : jobs) {
    std::vector<std::string> where;
    for (auto& [node, k] : r.where)
      where.push_back(fmt::format("{}:{}", printable(node), k));
    jr.push_back({printable(id), r.owner.empty() ? std::string{"-"} : printable(r.owner),
                  std::to_string(r.ranks),
                  where.empty() ? std::string{"-"} : fmt::format("{}", fmt::join(where, ",")),
                  ago(v.now_ms, r.since), r.state()});
  }
  return table(jr);
}

nlohmann::json jobs_json(const cluster_view& v) {
  auto out = nlohmann::json::array();
  for (auto& [id, r] : jobs_of(v)) {
    auto where = nlohmann::json::object();
    for (auto& [node, k] : r.where)
      where[node] = k;
    out.push_back({{"job", id},
                   {"owner", r.owner},
                   {"ranks", r.ranks},
                   {"nodes", where},
                   {"slots_held", r.held},
                   {"waiting_for", r.asked},
                   {"since_ms", r.since},
                   {"state", r.asked ? "waiting" : r.held && !r.ranks ? "starting" : "running"}});
  }
  return {{"holder", v.holder}, {"now_ms", v.now_ms}, {"jobs", out}};
}

nlohmann::json status_json(const cluster_view& v) {
  auto nodes = nlohmann::json::array();
  for (auto& n : v.nodes) {
    auto jobs = nlohmann::json::array();
    for (auto& j : n.info.jobs)
      jobs.push_back({{"job", j.job},
                      {"owner", j.owner},
                      {"ranks", j.ranks},
                      {"gpus", j.gpus},
                      {"since_ms", j.since_ms}});
    nodes.push_back({{"name", n.info.name},
                     {"state", n.state == "alive" && (n.info.draining || n.drained)
                                   ? (ranks_of(n.info) > 0 ? "draining" : "drained")
                                   : n.state},
                     {"address", n.info.address},
                     {"port", n.info.port},
                     {"slots", n.info.slots},
                     {"slots_used", ranks_of(n.info)},
                     {"gpus", n.info.gpus},
                     {"gpus_free", n.info.gpus_free},
                     {"labels", n.info.labels},
                     {"certificate", n.certificate},
                     {"shared_certificate", n.shared},
                     {"started_ms", n.info.started_ms},
                     {"joined_ms", n.joined_ms},
                     {"last_seen_ms", n.last_seen_ms},
                     {"gone_ms", n.gone_ms},
                     {"refused_connections", n.info.refused_connections},
                     {"refused_messages", n.info.refused_messages},
                     {"jobs", jobs}});
  }
  return {{"holder", v.holder}, {"now_ms", v.now_ms}, {"nodes", nodes}};
}

} // namespace cafhvd
