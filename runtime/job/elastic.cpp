// Discovery script runner (through the rank shim, with a deadline) and the elastic
// bookkeeping helpers.
#include "runtime/job/elastic.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "runtime/launch/process.hpp"

extern char** environ;

namespace cafhvd {

namespace {

constexpr size_t max_output = 4u << 20;

} // namespace

script_result run_discovery_script(const std::string& shim, const std::string& path,
                                   std::chrono::milliseconds timeout) {
  struct collected {
    std::mutex mtx;
    std::condition_variable cv;
    std::string out;
    std::deque<std::string> err_tail;
    std::optional<exit_status> exit;
  };
  auto c = std::make_shared<collected>();
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    env.emplace_back(*e);
  script_result r;
  std::unique_ptr<child_process> child;
  try {
    child = std::make_unique<child_process>(
        process_spec{shim, {path}, std::move(env), ""},
        [c](stream_kind k, std::vector<std::string>&& lines) {
          std::lock_guard<std::mutex> g{c->mtx};
          for (auto& l : lines) {
            if (k == stream_kind::out) {
              if (c->out.size() < max_output) {
                c->out += l;
                c->out += '\n';
              }
            } else {
              c->err_tail.push_back(std::move(l));
              if (c->err_tail.size() > 3)
                c->err_tail.pop_front();
            }
          }
        },
        [c](const exit_status& st) {
          std::lock_guard<std::mutex> g{c->mtx};
          c->exit = st;
          c->cv.notify_all();
        });
  } catch (const std::exception& e) {
    r.error = fmt::format("could not be started: {}", e.what());
    return r;
  }
  std::unique_lock<std::mutex> lk{c->mtx};
  if (!c->cv.wait_for(lk, timeout, [&] { return c->exit.has_value(); })) {
    lk.unlock();
    child->signal_group(SIGKILL);
    lk.lock();
    c->cv.wait_for(lk, std::chrono::seconds(5), [&] { return c->exit.has_value(); });
    r.error = fmt::format("did not finish within {} s and was killed", timeout.count() / 1000.0);
    return r;
  }
  auto st = *c->exit;
  if (!st.exec_error.empty()) {
    r.error = fmt::format("could not be started: {}", st.exec_error);
    return r;
  }
  if (st.launcher_code() != 0) {
    r.error = st.signal ? fmt::format("was killed by {}", st.describe())
                        : fmt::format("exited with code {}", st.code);
    if (!c->err_tail.empty()) {
      std::string tail;
      for (auto& l : c->err_tail)
        tail += (tail.empty() ? "" : "\n") + l;
      r.error += fmt::format("; its stderr ends with: {}", tail);
    }
    return r;
  }
  r.ok = true;
  r.output = std::move(c->out);
  return r;
}

std::vector<std::string> order_hosts(const std::vector<std::string>& previous,
                                     const std::vector<std::string>& available) {
  std::set<std::string> avail(available.begin(), available.end());
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (auto& h : previous)
    if (avail.count(h) && seen.insert(h).second)
      out.push_back(h);
  for (auto& h : available)
    if (seen.insert(h).second)
      out.push_back(h);
  return out;
}

std::chrono::milliseconds cooldown_delay(const cooldown_range& range, int failures, double u01) {
  double k = std::min(failures, 30);
  double delay = range.low * std::pow(2.0, k) + u01 * range.low;
  delay = std::clamp(delay, range.low, std::max(range.low, range.high));
  return std::chrono::milliseconds(static_cast<long>(delay * 1000));
}

const char* to_string(host_change c) {
  switch (c) {
  case host_change::none:
    return "none";
  case host_change::removed:
    return "removed";
  case host_change::added:
    return "added";
  case host_change::mixed:
    return "mixed";
  }
  return "none";
}

host_change compare_hosts(const std::vector<host_slots>& before,
                          const std::vector<host_slots>& after) {
  std::map<std::string, int> b, a;
  for (auto& h : before)
    b[h.hostname] = h.slots;
  for (auto& h : after)
    a[h.hostname] = h.slots;
  unsigned flags = 0;
  for (auto& [h, s] : b) {
    auto it = a.find(h);
    if (it == a.end() || it->second < s)
      flags |= static_cast<unsigned>(host_change::removed);
  }
  for (auto& [h, s] : a) {
    auto it = b.find(h);
    if (it == b.end() || s > it->second)
      flags |= static_cast<unsigned>(host_change::added);
  }
  return static_cast<host_change>(flags);
}

} // namespace cafhvd
