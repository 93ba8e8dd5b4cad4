// The job actor's output and report: ranks' lines to the terminal and to
// --output-filename files, the static phases in the event log, the closing summary.
#include "actors/job/job_actor.hpp"

namespace cafhvd::driver_impl {

// Static jobs' phases in the event log: each ends when the next begins.
void job::phase(const char* name) {
  auto now = clock_type::now();
  if (!phase_.empty()) {
    events_.emit("phase.end", {{"phase", phase_}});
    phase_ms_.emplace_back(phase_,
                           std::chrono::duration<double, std::milli>(now - phase_at_).count());
  }
  phase_ = name;
  phase_at_ = now;
  if (!phase_.empty())
    events_.emit("phase.begin", {{"phase", phase_}});
}

// The closing summary on stderr (--quiet turns it off): what ran where, how long each
// part took, how every process ended, and why the job ended as it did.
void job::summarize(int code) {
  if (job_.quiet)
    return;
  // every host that was ever ready, with how it ended where it did not last
  std::vector<std::string> used, black, names = used_hosts_;
  { // in the job's host order: -H, or the order discovery first listed them in
    std::vector<std::string> job_order;
    for (auto& ep : elastic_ ? ever_listed_ : order_)
      if (auto it = hosts_.find(ep); it != hosts_.end())
        job_order.push_back(it->second.info.name);
    std::stable_sort(names.begin(), names.end(), [&](auto& a, auto& b) {
      return std::find(job_order.begin(), job_order.end(), a)
             < std::find(job_order.begin(), job_order.end(), b);
    });
  }
  for (auto& name : names) {
    auto& end = host_end_.at(name);
    used.push_back(end.empty() ? name : fmt::format("{} {}", name, end));
  }
  for (auto& [ep, h] : hosts_)
    if (h.blacklisted)
      black.push_back(h.info.name.empty() ? ep : h.info.name);
  auto ends = process_ends_;
  for (auto& [id, s] : slots_)
    if (s.launching && s.exit_code < 0)
      ++ends["no exit seen"]; // still running, or lost with its host
  size_t processes = 0;
  for (auto& [what, n] : ends)
    processes += static_cast<size_t>(n);
  std::vector<std::string> end_text, phases;
  for (auto& [what, n] : ends)
    end_text.push_back(fmt::format("{} x {}", n, what));
  if (elastic_) {
    // an elastic job's time per generation: from its forming to the next one's
    for (size_t i = 0; i < gen_formed_.size(); ++i) {
      auto until = i + 1 < gen_formed_.size() ? gen_formed_[i + 1].second : clock_type::now();
      phases.push_back(fmt::format(
          "generation {} {:.1f}", gen_formed_[i].first,
          std::chrono::duration<double, std::milli>(until - gen_formed_[i].second).count()));
    }
  } else {
    for (auto& [p, ms] : phase_ms_)
      phases.push_back(fmt::format("{} {:.1f}", p, ms));
  }
  std::string text = fmt::format(
      "caf-hvd: summary: exit {}{}\n"
      "caf-hvd:   hosts        {} ({})\n"
      "caf-hvd:   processes    {} ({}); {} generation{}, the last of {} ranks\n"
      "caf-hvd:   time         {:.1f} ms{}\n",
      code,
      failure_       ? fmt::format(" ({})", *failure_)
      : interrupted_ ? " (interrupted)"
                     : "",
      used.size(), fmt::join(used, ", "), processes, fmt::join(end_text, ", "), gen_.number,
      gen_.number == 1 ? "" : "s", gen_.plan.size(), static_cast<double>(elapsed_ms()),
      phases.empty() ? std::string{} : fmt::format(" ({} ms)", fmt::join(phases, ", ")));
  if (!black.empty())
    text += fmt::format("caf-hvd:   blacklisted  {}\n", fmt::join(black, ", "));
  write_all(2, text);
}

void job::print_output(const output_batch& b) {
  auto* s = slot_by_id(b.rank);
  auto tag = output_tag(s ? s->rank : -1, b.stream);
  if (job_.prefix_timestamp) // horovodrun's format: the arrival time before the tag
    tag = fmt::format("{:%a %b %d %H:%M:%S %Y}{}", fmt::localtime(std::time(nullptr)), tag);
  write_lines(b.stream == 1 ? 2 : 1, b.lines, tag);
  if (job_.torch_store != torch_store_mode::off && !libuv_said_ && s)
    for (auto& line : b.lines)
      if (says_torch_lacks_libuv(line)) {
        libuv_said_ = true;
        write_all(2, torch_without_libuv_message(s->rank));
        if (job_.torch_store == torch_store_mode::on)
          fail("the torch store could not serve a client (--torch-store on)");
        break;
      }
  if (!s || job_.output_dir.empty())
    return;
  open_outputs(s->key);
  if (int fd = output_fds_.at(s->key)[b.stream == 1 ? 1 : 0]; fd >= 0)
    write_lines(fd, b.lines);
}

// --output-filename DIR: DIR/<host>:<local rank>/stdout and stderr per slot, created
// when the slot first starts (a slot's later processes append: ranks change between
// generations), and DIR/rank.N, a link to the slot that has rank N in the newest
// generation (horovodrun's paths).
void job::open_outputs(const std::string& key) {
  if (job_.output_dir.empty() || output_fds_.count(key))
    return;
  auto dir = fmt::format("{}/{}", job_.output_dir, key);
  ::mkdir(dir.c_str(), 0755);
  std::array<int, 2> fds{-1, -1};
  const char* names[2] = {"stdout", "stderr"};
  for (int i = 0; i < 2; ++i) {
    auto path = fmt::format("{}/{}", dir, names[i]);
    fds[i] = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fds[i] < 0)
      say("warning: cannot write {}: {}", path, std::strerror(errno));
  }
  output_fds_[key] = fds;
}

void job::link_rank_outputs() {
  if (job_.output_dir.empty())
    return;
  for (size_t r = 0; r < std::max(gen_.plan.size(), linked_ranks_); ++r) {
    auto link = fmt::format("{}/rank.{}", job_.output_dir, r);
    ::unlink(link.c_str());
    if (r < gen_.plan.size()
        && ::symlink(slot_key(gen_.plan[r].hostname, gen_.plan[r].local_rank).c_str(), link.c_str())
               != 0)
      say("warning: cannot link {}: {}", link, std::strerror(errno));
  }
  linked_ranks_ = gen_.plan.size();
}

} // namespace cafhvd::driver_impl
