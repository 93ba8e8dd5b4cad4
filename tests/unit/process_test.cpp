// Process supervision with real child processes: lines, exits, signals, exec errors.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <csignal>
#include <mutex>
#include <optional>
#include <unistd.h>

#include "runtime/launch/identity.hpp"
#include "runtime/launch/process.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

namespace {

// Collects a process's output and waits for its exit, with a deadline.
struct collector {
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<std::string> out, err;
  std::optional<exit_status> status;

  child_process::output_fn output() {
    return [this](stream_kind k, std::vector<std::string>&& lines) {
      std::lock_guard g{mtx};
      auto& dst = k == stream_kind::out ? out : err;
      dst.insert(dst.end(), lines.begin(), lines.end());
    };
  }
  child_process::exit_fn exit() {
    return [this](const exit_status& s) {
      std::lock_guard g{mtx};
      status = s;
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds d = 10s) {
    std::unique_lock g{mtx};
    return cv.wait_for(g, d, [this] { return status.has_value(); });
  }
};

process_spec sh(const std::string& script) {
  return process_spec{CAF_HVD_EXEC, {"sh", "-c", script}, {"PATH=/usr/bin:/bin"}, ""};
}

} // namespace

TEST_CASE("line splitter keeps lines whole and keeps a last line without newline") {
  line_splitter s{8};
  std::vector<std::string> out;
  s.feed("ab", 2, out);
  CHECK(out.empty());
  s.feed("c\nde\n\nf", 7, out);
  CHECK(out == std::vector<std::string>{"abc", "de", ""});
  s.finish(out);
  CHECK(out.back() == "f");
  out.clear();
  s.feed("0123456789", 10, out); // longer than the cap: emitted in pieces
  CHECK(out == std::vector<std::string>{"01234567"});
}

TEST_CASE("output, exit code and environment of a child") {
  collector c;
  auto spec = sh("echo out1; echo err1 >&2; printf 'tail'; echo \"v=$FOO\"; exit 3");
  spec.env.push_back("FOO=bar");
  child_process p{spec, c.output(), c.exit()};
  REQUIRE(c.wait());
  CHECK(c.status->code == 3);
  CHECK(c.status->signal == 0);
  CHECK(c.status->launcher_code() == 3);
  CHECK(c.out == std::vector<std::string>{"out1", "tailv=bar"});
  CHECK(c.err == std::vector<std::string>{"err1"});
}

TEST_CASE("a command that cannot be executed reports the OS error and 127") {
  collector c;
  child_process p{process_spec{CAF_HVD_EXEC, {"no-such-command-xyz"}, {"PATH=/bin"}, ""},
                  c.output(), c.exit()};
  REQUIRE(c.wait());
  CHECK(c.status->launcher_code() == 127);
  CHECK(c.status->describe().find("cannot execute 'no-such-command-xyz'") != std::string::npos);
  CHECK(c.status->describe().find("No such file or directory") != std::string::npos);
}

TEST_CASE("a missing working directory is an error at start") {
  collector c;
  auto spec = sh("true");
  spec.cwd = "/no/such/dir";
  CHECK_THROWS_WITH(child_process(spec, c.output(), c.exit()), doctest::Contains("/no/such/dir"));
}

TEST_CASE("signals reach the whole group and are reported as such") {
  collector c;
  child_process p{sh("sleep 30 & wait"), c.output(), c.exit()};
  usleep(100'000);
  p.signal_group(SIGKILL);
  REQUIRE(c.wait());
  CHECK(c.status->signal == SIGKILL);
  CHECK(c.status->launcher_code() == 137);
}

TEST_CASE("SIGTERM to the group: the command's own end is reported") {
  collector c;
  child_process p{sh("trap 'echo bye; exit 7' TERM; echo ready; while :; do sleep 0.05; done"),
                  c.output(), c.exit()};
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard g{c.mtx};
      if (!c.out.empty())
        break;
    }
    usleep(20'000);
  }
  p.signal_group(SIGTERM);
  REQUIRE(c.wait());
  CHECK(c.status->code == 7);
  CHECK(c.out.back() == "bye");
}

TEST_CASE("an exit is seen at once even if a grandchild keeps the pipes open") {
  collector c;
  auto t0 = std::chrono::steady_clock::now();
  child_process p{sh("sleep 5 & exit 4"), c.output(), c.exit()};
  REQUIRE(c.wait(3s));
  CHECK(c.status->code == 4);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}

TEST_CASE("destroying the handle kills the group") {
  collector c;
  {
    child_process p{sh("sleep 30"), c.output(), c.exit()};
    usleep(50'000);
  }
  REQUIRE(c.wait());
  CHECK(c.status->signal == SIGKILL);
}

TEST_CASE("a rank leads a session of its own, so the kernel weighs it as its own scheduler "
          "autogroup as horovodrun's ranks are, not in one group with its agent's other ranks") {
  collector c;
  // fields 5 and 6 of /proc/PID/stat (after the command's name in parentheses): the
  // process group and the session of the command's shell
  child_process p{sh("cut -d')' -f2 /proc/$$/stat | cut -d' ' -f4,5"), c.output(), c.exit()};
  REQUIRE(c.wait());
  REQUIRE(c.status->code == 0);
  REQUIRE(c.out.size() == 1);
  auto leader = std::to_string(p.pid()); // the shim leads both
  CHECK(c.out[0] == leader + " " + leader);
  CHECK(std::to_string(::getsid(0)) != leader);
}

TEST_CASE("many lines arrive complete and in order under flow control") {
  collector c;
  flow_window window{2};
  std::vector<std::string> got;
  std::mutex m;
  child_process p{sh("i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done"),
                  [&](stream_kind, std::vector<std::string>&& lines) {
                    window.acquire();
                    std::lock_guard g{m};
                    got.insert(got.end(), lines.begin(), lines.end());
                    window.release();
                  },
                  c.exit()};
  REQUIRE(c.wait(60s));
  REQUIRE(got.size() == 20000);
  for (size_t i = 0; i < got.size(); i += 997)
    CHECK(got[i] == "line-" + std::to_string(i));
  CHECK(got.back() == "line-19999");
}

TEST_CASE("nothing a rank started outlives its command") {
  collector c;
  child_process p{sh("sleep 31.4159 & echo started; exit 0"), c.output(), c.exit()};
  REQUIRE(c.wait());
  CHECK(c.status->code == 0);
  CHECK(c.out == std::vector<std::string>{"started"});
  usleep(100'000);
  CHECK(std::system("pgrep -f 'sleep 31[.]4159' >/dev/null") != 0);
}

TEST_CASE("a writer that escaped the group does not stall the exit report") {
  collector c;
  auto t0 = std::chrono::steady_clock::now();
  child_process p{sh("setsid sh -c 'yes | head -c 50000000; sleep 2' & sleep 0.2; exit 6"),
                  c.output(), c.exit()};
  REQUIRE(c.wait(5s));
  CHECK(c.status->code == 6);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

TEST_CASE("a rank inherits no descriptor of its agent") {
  int leaked = ::dup(1); // an open descriptor without O_CLOEXEC
  collector c;
  child_process p{sh("ls /proc/self/fd | sort -n | tr '\\n' ' '"), c.output(), c.exit()};
  REQUIRE(c.wait());
  ::close(leaked);
  REQUIRE(c.out.size() == 1);
  // 0-2 and the descriptor ls uses to read the directory (3); nothing else.
  CHECK(c.out[0] == "0 1 2 3 ");
}

TEST_CASE("the shim becomes the rank's account before the command: uid, gid and groups in "
          "every slot, no capability left") {
  // The isolation suite checks the same on a whole agent, in namespaces; this one needs
  // only root (where CI runs) and a machine without namespaces.
  if (::geteuid() != 0) {
    if (std::getenv("CI"))
      FAIL("needs root to switch to another account, and CI runs as root");
    MESSAGE("skipped: switching accounts needs root");
    return;
  }
  collector c;
  auto spec = sh("id -u; id -g; id -G; grep -E '^Cap(Prm|Eff|Amb):' /proc/self/status; pwd");
  spec.as = identity_arg(rank_identity{65534, 65533, {65533, 65532}, "nobody", "/"});
  spec.cwd = "/tmp";
  child_process p{spec, c.output(), c.exit()};
  REQUIRE(c.wait());
  CHECK(c.status->code == 0);
  CHECK(c.out == std::vector<std::string>{"65534", "65533", "65533 65532",
                                          "CapPrm:\t0000000000000000",
                                          "CapEff:\t0000000000000000",
                                          "CapAmb:\t0000000000000000", "/tmp"});
}

TEST_CASE("a rank's sign of life: the CPU time of its whole process tree, which a blocked or "
          "stopped tree does not use") {
  // busy: a grandchild of the shim (the shell that started it only waits)
  collector busy;
  child_process b{sh("( while :; do :; done ) & wait"), busy.output(), busy.exit()};
  // blocked: every process of the tree sleeps
  collector idle;
  child_process i{sh("sleep 30 & wait"), idle.output(), idle.exit()};
  usleep(200'000);
  auto b0 = tree_cpu_ticks(b.pid());
  auto i0 = tree_cpu_ticks(i.pid());
  usleep(400'000);
  auto b1 = tree_cpu_ticks(b.pid());
  auto i1 = tree_cpu_ticks(i.pid());
  CHECK(b1 > b0 + 5); // 40 ticks of 10 ms at most; a busy loop on a shared core gets some
  CHECK(i1 == i0);
  // stopped (SIGSTOP, as a hung or debugged rank): no more CPU time
  b.signal_group(SIGSTOP);
  usleep(100'000);
  auto s0 = tree_cpu_ticks(b.pid());
  usleep(300'000);
  CHECK(tree_cpu_ticks(b.pid()) == s0);
  b.signal_group(SIGKILL);
  i.signal_group(SIGKILL);
  REQUIRE(busy.wait());
  REQUIRE(idle.wait());
  CHECK(tree_cpu_ticks(b.pid()) == 0); // gone (and reaped)
  CHECK(tree_cpu_ticks(0) == 0);
}
