// Discovery script runner (posix_spawn, poll with a deadline, process-group kill) and
// the elastic bookkeeping helpers.
#include "runtime/elastic.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <poll.h>
#include <set>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

extern char** environ;

namespace cafhvd {

namespace {

constexpr size_t max_output = 4u << 20;

std::string describe_status(int status) {
  if (WIFEXITED(status))
    return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return "ended abnormally";
}

std::string tail_lines(const std::string& s, size_t lines) {
  auto end = s.find_last_not_of("\n ");
  if (end == std::string::npos)
    return "";
  size_t pos = end + 1;
  for (size_t n = 0; n < lines && pos > 0; ++n) {
    auto nl = s.rfind('\n', pos - 1);
    pos = nl == std::string::npos ? 0 : nl;
  }
  auto t = s.substr(pos, end + 1 - pos);
  if (!t.empty() && t[0] == '\n')
    t.erase(0, 1);
  return t;
}

} // namespace

script_result run_discovery_script(const std::string& path, std::chrono::milliseconds timeout) {
  script_result r;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    r.error = fmt::format("cannot create a pipe: {}", std::strerror(errno));
    return r;
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    r.error = fmt::format("cannot create a pipe: {}", std::strerror(errno));
    ::close(out[0]);
    ::close(out[1]);
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  pid_t pid = 0;
  char* argv[] = {const_cast<char*>(path.c_str()), nullptr};
  int rc = posix_spawn(&pid, path.c_str(), &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    r.error = fmt::format("could not be started: {}", std::strerror(rc));
    return r;
  }
  std::string errtext;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  bool timed_out = false;
  char buf[65536];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      auto got = ::read(fds[i].fd, buf, sizeof(buf));
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      auto& dst = i == 0 ? r.output : errtext;
      if (dst.size() < max_output)
        dst.append(buf, static_cast<size_t>(got));
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0)
      ::close(f.fd);
  if (timed_out)
    ::kill(-pid, SIGKILL);
  int status = 0;
  // Stdout closed: the script is ending; give it until the deadline to be reaped.
  for (;;) {
    auto w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid)
      break;
    if (w < 0 && errno != EINTR) {
      status = 0;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline && !timed_out) {
      timed_out = true;
      ::kill(-pid, SIGKILL);
    }
    ::usleep(1000);
  }
  if (timed_out) {
    r.error = fmt::format("did not finish within {} s and was killed", timeout.count() / 1000.0);
    return r;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    r.error = describe_status(status);
    if (auto t = tail_lines(errtext, 3); !t.empty())
      r.error += fmt::format("; its stderr ends with: {}", t);
    return r;
  }
  r.ok = true;
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
