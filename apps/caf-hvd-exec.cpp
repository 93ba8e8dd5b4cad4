// caf-hvd-exec: the parent of every rank's command. It leads the rank's session and
// process group, dies with the node agent and takes the group with it
// (PR_SET_PDEATHSIG works on the agent's side; the shim turns it into a SIGKILL of the
// whole group, grandchildren included), reports how the command ended on a status
// descriptor, and then ends the rest of the group, so nothing of a rank outlives its
// command.
//
// An agent that runs ranks as their owner's account passes --as UID:GID:GROUPS (and
// --cwd DIR): the shim becomes that account first (supplementary groups, gid, uid, and
// no capability left in any set), then enters DIR as it, so nothing of the agent's
// privilege reaches the command.
//
// usage: caf-hvd-exec AGENT_PID STATUS_FD [--as UID:GID:G1,G2,... [--cwd DIR]] --
//        COMMAND [ARGS...]
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <grp.h>
#include <initializer_list>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace {

int status_fd = -1;

void report(const char* fmt, int value) {
  if (status_fd < 0)
    return;
  char buf[64];
  int n = std::snprintf(buf, sizeof(buf), fmt, value);
  if (n > 0)
    (void)!::write(status_fd, buf, static_cast<size_t>(n));
}

void on_agent_death(int) {
  ::kill(0, SIGKILL); // the whole process group, this shim included
}

// A stop signal that came before the command existed (the agent stopping a rank that is
// still starting): the command never got it, so the shim passes it on.
volatile sig_atomic_t early_signal = 0;
volatile sig_atomic_t command_started = 0;

void on_forwarded_signal(int sig) {
  // The agent signals the whole group, so a running command got this signal too; the
  // shim stays to report how the command ends.
  if (!command_started)
    early_signal = sig;
}

// "UID:GID:G1,G2,..." (groups may be empty) -> false on anything else.
bool parse_account(const char* s, uid_t& uid, gid_t& gid, gid_t* groups, size_t& n, size_t max) {
  char* end = nullptr;
  errno = 0;
  unsigned long u = std::strtoul(s, &end, 10);
  if (errno || end == s || *end != ':')
    return false;
  s = end + 1;
  unsigned long g = std::strtoul(s, &end, 10);
  if (errno || end == s || *end != ':')
    return false;
  s = end + 1;
  uid = static_cast<uid_t>(u);
  gid = static_cast<gid_t>(g);
  n = 0;
  while (*s) {
    unsigned long x = std::strtoul(s, &end, 10);
    if (errno || end == s || n == max || (*end != ',' && *end != '\0'))
      return false;
    groups[n++] = static_cast<gid_t>(x);
    s = *end ? end + 1 : end;
  }
  return true;
}

// Becomes the account for good: its groups, gid and uid in every slot (real, effective,
// saved), then no capability in any set (an agent that is not root keeps its
// capabilities across a uid change; the kernel drops them only coming from uid 0).
// Returns 0 or the errno of the step that failed.
int become(uid_t uid, gid_t gid, const gid_t* groups, size_t n) {
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  if (::setgroups(n, groups) != 0 || ::setresgid(gid, gid, gid) != 0
      || ::setresuid(uid, uid, uid) != 0)
    return errno;
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2]{};
  if (::syscall(SYS_capset, &hdr, none) != 0)
    return errno;
  uid_t r = 0, e = 0, s = 0;
  if (::getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid)
    return EPERM;
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  // AGENT_PID STATUS_FD [--as ACCOUNT [--cwd DIR]] -- COMMAND...
  int cmd = 3;
  const char* account = nullptr;
  const char* cwd = nullptr;
  if (argc > 4 && std::strcmp(argv[3], "--as") == 0) {
    account = argv[4];
    cmd = 5;
    if (argc > 6 && std::strcmp(argv[5], "--cwd") == 0) {
      cwd = argv[6];
      cmd = 7;
    }
  }
  if (argc < cmd + 2 || std::strcmp(argv[cmd], "--") != 0) {
    std::fprintf(stderr, "usage: caf-hvd-exec AGENT_PID STATUS_FD [--as UID:GID:GROUPS "
                         "[--cwd DIR]] -- COMMAND [ARGS...]\n"
                         "(started by caf-hvd node agents; not meant to be run by hand)\n");
    return 2;
  }
  char** command = argv + cmd + 1;
  pid_t agent = static_cast<pid_t>(std::atol(argv[1]));
  status_fd = std::atoi(argv[2]);
  if (status_fd >= 0)
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
  // The account first: a credential change clears the parent-death signal set below.
  if (account) {
    uid_t uid = 0;
    gid_t gid = 0;
    static gid_t groups[65536];
    size_t n = 0;
    if (!parse_account(account, uid, gid, groups, n, sizeof(groups) / sizeof(groups[0]))) {
      report("account %d", EINVAL);
      return 127;
    }
    if (int e = become(uid, gid, groups, n); e != 0) {
      report("account %d", e);
      return 127;
    }
    if (cwd && ::chdir(cwd) != 0) {
      report("cwd %d", errno);
      return 127;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = on_agent_death;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, nullptr);
  sa.sa_handler = on_forwarded_signal;
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT})
    sigaction(sig, &sa, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGUSR2);
  if (getppid() != agent) // the agent died before the line above took effect
    on_agent_death(0);
  prctl(PR_SET_CHILD_SUBREAPER, 1); // orphans of the command stay in reach

  // The agent raised its own descriptor limit; the rank gets the one it started with.
  if (const char* orig = std::getenv("CAF_HVD_RANK_NOFILE")) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
      lim.rlim_cur =
          std::min<rlim_t>(static_cast<rlim_t>(std::strtoull(orig, nullptr, 10)), lim.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
    ::unsetenv("CAF_HVD_RANK_NOFILE");
  }
  // fork + exec rather than posix_spawn, so the command can be told to die with this
  // shim: a batch system that kills a step's processes one by one (Slurm's
  // proctrack/linuxproc) may SIGKILL the shim before its own handler ends the group, and
  // the command, reparented, would then be out of everyone's reach. An exec failure
  // comes back through a close-on-exec pipe.
  int failed_exec[2];
  if (::pipe2(failed_exec, O_CLOEXEC) != 0) {
    report("exec %d", errno);
    return 127;
  }
  pid_t shim = ::getpid();
  // Signals stay blocked across the fork until the child has default handlers again (as
  // posix_spawn does): a SIGTERM for the group that arrives in between is then held and
  // ends the child, instead of running the shim's no-op handler and being lost.
  sigset_t all, before;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &before);
  pid_t child = ::fork();
  if (child < 0) {
    sigprocmask(SIG_SETMASK, &before, nullptr);
    report("exec %d", errno);
    return 127;
  }
  if (child == 0) {
    ::close(failed_exec[0]);
    for (int sig : {SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT}) // the shim's handlers
      ::signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &before, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != shim) // the shim died before the line above took effect
      ::_exit(127);
    ::execvp(command[0], command);
    int e = errno;
    (void)!::write(failed_exec[1], &e, sizeof(e));
    ::_exit(127);
  }
  sigprocmask(SIG_SETMASK, &before, nullptr); // signals held since the fork run now
  command_started = 1;
  if (early_signal)
    ::kill(child, early_signal);
  ::close(failed_exec[1]);
  int exec_errno = 0;
  ssize_t n = -1;
  do {
    n = ::read(failed_exec[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  ::close(failed_exec[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    report("exec %d", exec_errno);
    return 127;
  }
  int wstatus = 0;
  for (;;) {
    pid_t got = waitpid(-1, &wstatus, 0);
    if (got == child)
      break;
    if (got < 0 && errno != EINTR)
      return 1;
  }
  if (WIFSIGNALED(wstatus))
    report("signal %d", WTERMSIG(wstatus));
  else
    report("exit %d", WEXITSTATUS(wstatus));
  // The rank is its command: whatever the command left running in its process group
  // (background jobs, orphans) ends with it. This takes the shim too; the agent reads
  // the status reported above.
  ::kill(0, SIGKILL);
  return 1;
}
