// The generation value and the lifecycle's rules (see the header).
#include "runtime/job/generation.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/horovod/rendezvous_server.hpp"

namespace cafhvd {

namespace {
std::string key_of(const slot_info& s) {
  return slot_key(s.hostname, s.local_rank);
}
} // namespace

generation::generation(uint64_t n, std::vector<slot_info> p, job_clock::time_point now)
    : number(n), plan(std::move(p)), began(now) {
  for (auto& s : plan)
    rows[key_of(s)] = s;
}

bool generation::complete() const {
  return std::all_of(rows.begin(), rows.end(),
                     [&](auto& r) { return votes.count(r.first) || fresh.count(r.first); });
}

std::vector<std::string> generation::missing() const {
  std::vector<std::string> out;
  for (auto& s : plan)
    if (!votes.count(key_of(s)) && !fresh.count(key_of(s)))
      out.push_back(key_of(s));
  return out;
}

std::vector<std::string> generation::hosts() const {
  return plan_host_names(plan);
}

std::vector<std::string> plan_host_names(const std::vector<slot_info>& plan) {
  std::vector<std::string> out;
  for (auto& s : plan)
    if (std::find(out.begin(), out.end(), s.hostname) == out.end())
      out.push_back(s.hostname);
  return out;
}

std::string generation::describe() const {
  return fmt::format("generation {} ({}): {} ranks, votes {}/{}, {} fresh, hosts {}", number,
                     released ? "released" : "forming", plan.size(), votes.size(),
                     rows.size() - fresh.size(), fresh.size(), fmt::join(hosts(), ","));
}

join_deadline deadline_for(const generation& g, const slot_process& p,
                           std::chrono::milliseconds start_timeout,
                           std::chrono::milliseconds elastic_timeout) {
  if (p.joined > 0)
    return {deadline_kind::carrying, std::max(g.began, p.alive) + elastic_timeout};
  job_clock::time_point from;
  if (g.number <= 1) {
    if (!g.first_vote)
      return {};
    from = *g.first_vote;
  } else {
    from = g.began;
  }
  return {deadline_kind::fresh, std::max(from, p.started) + start_timeout};
}

std::vector<std::string> state_carriers(uint64_t released, const std::vector<slot_process>& slots,
                                        const std::set<std::string>& available) {
  std::vector<std::string> out;
  if (released == 0)
    return out;
  for (auto& p : slots)
    if (p.running && p.holds_state && p.joined >= released && available.count(p.host))
      out.push_back(p.key);
  return out;
}

} // namespace cafhvd
