// Starts rank processes with posix_spawn (no fork of a multi-threaded process) and
// watches them with poll on their pipes plus a pidfd, so an exit is seen at once even
// when a background grandchild keeps the pipes open.
#include "runtime/launch/process.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <dirent.h>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdexcept>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

namespace cafhvd {

void line_splitter::feed(const char* data, size_t n, std::vector<std::string>& out) {
  const char* end = data + n;
  while (data < end) {
    auto nl = static_cast<const char*>(std::memchr(data, '\n', end - data));
    if (!nl) {
      partial_.append(data, end);
      break;
    }
    if (partial_.empty()) {
      out.emplace_back(data, nl);
    } else {
      partial_.append(data, nl);
      out.push_back(std::move(partial_));
      partial_.clear();
    }
    data = nl + 1;
  }
  while (partial_.size() >= max_line_) {
    out.push_back(partial_.substr(0, max_line_));
    partial_.erase(0, max_line_);
  }
}

void line_splitter::finish(std::vector<std::string>& out) {
  if (!partial_.empty()) {
    out.push_back(std::move(partial_));
    partial_.clear();
  }
}

bool flow_window::acquire() {
  std::unique_lock guard{mtx_};
  cv_.wait(guard, [this] { return closed_ || credits_ > 0; });
  if (closed_)
    return false;
  --credits_;
  return true;
}

void flow_window::release() {
  {
    std::lock_guard guard{mtx_};
    ++credits_;
  }
  cv_.notify_one();
}

void flow_window::close() {
  {
    std::lock_guard guard{mtx_};
    closed_ = true;
  }
  cv_.notify_all();
}

int exit_status::launcher_code() const {
  if (!exec_error.empty())
    return 127;
  return signal != 0 ? 128 + signal : code;
}

std::string exit_status::describe() const {
  if (!exec_error.empty())
    return exec_error;
  if (signal != 0)
    return fmt::format("signal {} ({})", signal, strsignal(signal));
  return fmt::format("exit code {}", code);
}

namespace {
// The soft descriptor limit before raise_descriptor_limit (0 = not raised).
std::atomic<rlim_t> original_nofile{0};
} // namespace

void raise_descriptor_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max)
    return;
  auto before = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) == 0)
    original_nofile = before;
}

struct child_process::shared {
  pid_t pid = -1;
  std::atomic<bool> reaped{false};
  std::mutex mtx; // orders signal_group against reaping, so a recycled pid is never hit
};

namespace {

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v)
    out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Parses the shim's status line: "exec ERRNO", "exit CODE", "signal SIG", "account
// ERRNO" (it could not become the rank's account) or "cwd ERRNO" (nor, as it, enter the
// working directory).
bool parse_status(const std::string& text, const std::string& cmd, exit_status& st) {
  int value = 0;
  if (std::sscanf(text.c_str(), "account %d", &value) == 1) {
    st.exec_error = fmt::format("cannot switch to the rank's account: {}", std::strerror(value));
    return true;
  }
  if (std::sscanf(text.c_str(), "cwd %d", &value) == 1) {
    st.exec_error = fmt::format("cannot enter the working directory as the rank's account: {}",
                                std::strerror(value));
    return true;
  }
  if (std::sscanf(text.c_str(), "exec %d", &value) == 1) {
    st.exec_error = fmt::format("cannot execute '{}': {}", cmd, std::strerror(value));
    return true;
  }
  if (std::sscanf(text.c_str(), "exit %d", &value) == 1) {
    st = exit_status{value, 0, {}};
    return true;
  }
  if (std::sscanf(text.c_str(), "signal %d", &value) == 1) {
    st = exit_status{0, value, {}};
    return true;
  }
  return false;
}

} // namespace

child_process::child_process(const process_spec& spec, output_fn on_output, exit_fn on_exit)
    : shared_(std::make_shared<shared>()) {
  if (spec.argv.empty())
    throw std::runtime_error("empty command");
  int out_pipe[2], err_pipe[2], status_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  fd_guard o0{out_pipe[0]}, o1{out_pipe[1]};
  if (pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  fd_guard e0{err_pipe[0]}, e1{err_pipe[1]};
  if (pipe2(status_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  fd_guard s0{status_pipe[0]}, s1{status_pipe[1]};

  std::vector<std::string> args{spec.shim, std::to_string(getpid()), "3"};
  if (!spec.as.empty()) {
    // the shim becomes the rank's account first, then enters the directory as it
    args.insert(args.end(), {"--as", spec.as});
    if (!spec.cwd.empty())
      args.insert(args.end(), {"--cwd", spec.cwd});
  }
  args.push_back("--");
  args.insert(args.end(), spec.argv.begin(), spec.argv.end());
  auto argv = c_strings(args);
  auto env = spec.env;
  if (auto orig = original_nofile.load(); orig != 0)
    env.push_back(fmt::format("CAF_HVD_RANK_NOFILE={}", static_cast<unsigned long long>(orig)));
  auto envp = c_strings(env);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (spec.stdin_fd >= 0)
    posix_spawn_file_actions_adddup2(&fa, spec.stdin_fd, 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  posix_spawn_file_actions_adddup2(&fa, status_pipe[1], 3);
  // Executor mode: the channel becomes descriptor 4 (the shim leaves it open for the
  // command; a copy under another number first, since dup2(4, 4) would keep CLOEXEC).
  fd_guard channel_copy;
  if (spec.channel_fd >= 0) {
    channel_copy.fd = fcntl(spec.channel_fd, F_DUPFD_CLOEXEC, rank_channel_fd + 1);
    if (channel_copy.fd < 0)
      throw std::runtime_error(fmt::format("dup: {}", std::strerror(errno)));
    posix_spawn_file_actions_adddup2(&fa, channel_copy.fd, rank_channel_fd);
  }
  // No descriptor of the agent reaches a rank (libraries such as Asio open sockets
  // without O_CLOEXEC); the shim gets stdio, its status descriptor and the channel.
  posix_spawn_file_actions_addclosefrom_np(&fa, spec.channel_fd >= 0 ? rank_channel_fd + 1
                                                                     : rank_channel_fd);
  if (!spec.cwd.empty() && spec.as.empty())
    posix_spawn_file_actions_addchdir_np(&fa, spec.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);   // agents block signals for sigwait
  posix_spawnattr_setsigdefault(&attr, &all); // and ranks start with default handlers
  // A session of its own (so a process group of its own too, led by the shim), as
  // horovodrun gives each rank (safe_shell_exec's setsid). The kernel's scheduler
  // autogroups are per session: ranks left in their agent's session share one autogroup
  // per agent, so where several agents share a machine one job's ranks were weighed in
  // groups, and a rank whose peer waited in the other group stalled its collectives for
  // seconds (Horovod's test_torch.py on 2 agents x 2 ranks took 460 s instead of 180 s).
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, spec.shim.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    if (!spec.cwd.empty() && spec.as.empty() && access(spec.cwd.c_str(), X_OK) != 0)
      throw std::runtime_error(
          fmt::format("cannot enter working directory {}: {}", spec.cwd, std::strerror(errno)));
    throw std::runtime_error(fmt::format("cannot start {}: {}", spec.shim, std::strerror(rc)));
  }
  pid_ = pid;
  shared_->pid = pid;
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    ::kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    throw std::runtime_error(fmt::format("pidfd_open: {}", std::strerror(errno)));
  }
  int fds[3] = {o0.fd, e0.fd, s0.fd};
  o0.fd = e0.fd = s0.fd = -1;
  for (int fd : fds)
    fcntl(fd, F_SETFL, O_NONBLOCK);
  std::thread{[sh = shared_, fds_out = fds[0], fds_err = fds[1], status_fd = fds[2], pidfd,
               cmd = spec.argv[0], on_output = std::move(on_output),
               on_exit = std::move(on_exit)]() mutable {
    line_splitter splitters[2];
    int fds[2] = {fds_out, fds_err};
    std::vector<char> buf(1 << 16);
    // Reads what is available on stream i, at most 1 MiB per round so that a writer
    // that never pauses cannot hold back the exit check; returns false at EOF.
    auto pump = [&](int i) {
      for (int round = 0; round < 16; ++round) {
        auto n = ::read(fds[i], buf.data(), buf.size());
        if (n > 0) {
          std::vector<std::string> lines;
          splitters[i].feed(buf.data(), static_cast<size_t>(n), lines);
          if (!lines.empty())
            on_output(static_cast<stream_kind>(i), std::move(lines));
          continue;
        }
        if (n < 0 && errno == EINTR)
          continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      }
      return true;
    };
    bool open[2] = {true, true};
    for (;;) {
      pollfd p[3] = {{open[0] ? fds[0] : -1, POLLIN, 0},
                     {open[1] ? fds[1] : -1, POLLIN, 0},
                     {pidfd, POLLIN, 0}};
      if (::poll(p, 3, -1) < 0) {
        if (errno == EINTR)
          continue;
        break;
      }
      for (int i = 0; i < 2; ++i)
        if (open[i] && (p[i].revents & (POLLIN | POLLHUP | POLLERR)))
          open[i] = pump(i);
      if (p[2].revents & POLLIN)
        break;
    }
    int wstatus = 0;
    {
      std::lock_guard guard{sh->mtx};
      while (waitpid(sh->pid, &wstatus, 0) < 0 && errno == EINTR) {
      }
      sh->reaped = true;
    }
    // Whatever the process wrote before it ended is in the pipes now; take that much
    // (a process that escaped the group may still write: it does not hold us up).
    for (int i = 0; i < 2; ++i) {
      int pending = 0;
      if (!open[i] || ioctl(fds[i], FIONREAD, &pending) != 0)
        pending = 0;
      while (pending > 0) {
        auto n = ::read(fds[i], buf.data(), std::min(buf.size(), static_cast<size_t>(pending)));
        if (n <= 0)
          break;
        pending -= static_cast<int>(n);
        std::vector<std::string> lines;
        splitters[i].feed(buf.data(), static_cast<size_t>(n), lines);
        if (!lines.empty())
          on_output(static_cast<stream_kind>(i), std::move(lines));
      }
      std::vector<std::string> last;
      splitters[i].finish(last);
      if (!last.empty())
        on_output(static_cast<stream_kind>(i), std::move(last));
    }
    exit_status st;
    char sbuf[128] = {};
    auto n = ::read(status_fd, sbuf, sizeof(sbuf) - 1);
    if (n <= 0 || !parse_status(std::string(sbuf, static_cast<size_t>(n)), cmd, st)) {
      if (WIFSIGNALED(wstatus))
        st = exit_status{0, WTERMSIG(wstatus), {}};
      else
        st = exit_status{WEXITSTATUS(wstatus), 0, {}};
    }
    for (int fd : {fds[0], fds[1], status_fd, pidfd})
      ::close(fd);
    on_exit(st);
  }}.detach();
}

child_process::~child_process() {
  signal_group(SIGKILL);
}

void child_process::signal_group(int sig) {
  std::lock_guard guard{shared_->mtx};
  if (!shared_->reaped)
    ::kill(-shared_->pid, sig);
}

int find_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  fd_guard g{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return 0;
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return 0;
  return ntohs(addr.sin_port);
}

namespace {

// The whole of a small /proc file ("" if it cannot be read).
std::string read_small(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "re")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && out.size() < (1u << 20))
      out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// utime + stime + cutime + cstime of /proc/PID/stat (fields 14-17; the command name,
// field 2, is in parentheses and may hold spaces or parentheses itself).
uint64_t stat_cpu_ticks(const std::string& stat) {
  auto close = stat.rfind(')');
  if (close == std::string::npos)
    return 0;
  // fields from 3 (state) on, space-separated
  uint64_t sum = 0;
  int field = 3;
  size_t i = close + 1;
  while (i < stat.size() && field <= 17) {
    while (i < stat.size() && stat[i] == ' ')
      ++i;
    size_t j = i;
    while (j < stat.size() && stat[j] != ' ')
      ++j;
    if (field >= 14) {
      // cutime and cstime are signed in the kernel's format; never negative in practice
      auto v = std::strtoll(stat.c_str() + i, nullptr, 10);
      if (v > 0)
        sum += static_cast<uint64_t>(v);
    }
    ++field;
    i = j;
  }
  return sum;
}

} // namespace

uint64_t tree_cpu_ticks(int root) {
  if (root <= 0)
    return 0;
  uint64_t sum = 0;
  std::vector<int> todo{root};
  size_t visited = 0;
  while (!todo.empty() && visited < 4096) {
    int pid = todo.back();
    todo.pop_back();
    ++visited;
    auto stat = read_small(fmt::format("/proc/{}/stat", pid));
    if (stat.empty())
      continue; // gone since it was listed
    sum += stat_cpu_ticks(stat);
    // children are listed per thread (the one that forked them)
    auto tasks = fmt::format("/proc/{}/task", pid);
    if (DIR* d = ::opendir(tasks.c_str())) {
      while (auto* e = ::readdir(d)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
          continue;
        auto kids = read_small(fmt::format("{}/{}/children", tasks, e->d_name));
        const char* p = kids.c_str();
        char* end = nullptr;
        for (long v = std::strtol(p, &end, 10); end != p; v = std::strtol(p, &end, 10)) {
          if (v > 0)
            todo.push_back(static_cast<int>(v));
          p = end;
        }
      }
      ::closedir(d);
    }
  }
  return sum;
}

std::string executable_dir() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

} // namespace cafhvd
