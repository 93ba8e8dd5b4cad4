// Process supervision for one rank: start the command through the caf-hvd-exec shim in
// its own process group, stream its output as whole lines, report how it ended.
// Knows nothing about actors; callers get callbacks on a reader thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <vector>

namespace cafhvd {

enum class stream_kind : int { out = 0, err = 1 };

/// Splits a byte stream into lines without ever splitting or merging them; a line
/// longer than `max_line` is emitted in pieces of that size.
class line_splitter {
public:
  explicit line_splitter(size_t max_line = 1 << 20) : max_line_(max_line) {}
  /// Appends complete lines of `data` (without '\n') to `out`.
  void feed(const char* data, size_t n, std::vector<std::string>& out);
  /// Emits the pending last line (one without a trailing newline), if any.
  void finish(std::vector<std::string>& out);

private:
  std::string partial_;
  size_t max_line_;
};

/// A credit counter that lets a reader thread run at most `capacity` batches ahead of
/// their consumer, so a rank printing without pause cannot exhaust memory: the pipe
/// fills and the rank blocks, and nothing is dropped.
class flow_window {
public:
  explicit flow_window(int capacity) : credits_(capacity) {}
  /// Takes a credit, waiting while none is left; returns false once closed.
  bool acquire();
  void release();
  /// Wakes every waiter for good (the consumer is gone).
  void close();

private:
  std::mutex mtx_;
  std::condition_variable cv_;
  int credits_;
  bool closed_ = false;
};

/// How a rank's process ended.
struct exit_status {
  int code = 0;           // exit code when it exited
  int signal = 0;         // terminating signal, 0 if it exited
  std::string exec_error; // non-empty when the command could not be executed
  /// Exit code a launcher reports: code, 128+signal, or 127 for exec failures.
  int launcher_code() const;
  /// "exit code 3", "signal 9 (Killed)", "cannot execute 'x': No such file or directory".
  std::string describe() const;
};

struct process_spec {
  std::string shim;              // path of caf-hvd-exec
  std::vector<std::string> argv; // the user's command, argv[0] looked up in PATH
  std::vector<std::string> env;  // complete environment, KEY=VALUE
  std::string cwd;               // working directory ("" = inherit)
  int channel_fd = -1;           // executor mode: becomes the command's descriptor 4
  int stdin_fd = -1;             // the command's stdin (default: /dev/null)
  // The account the command runs as ("" = the agent's): caf-hvd-exec's --as argument
  // (identity_arg), applied by the shim before it enters `cwd` and starts the command.
  std::string as = {};
};

/// The descriptor number under which an executor's rank process finds its channel.
inline constexpr int rank_channel_fd = 4;

/// A running rank process. Destroying it kills the whole process group; the reader
/// thread still reaps the child and reports the exit through `on_exit`.
class child_process {
public:
  using output_fn = std::function<void(stream_kind, std::vector<std::string>&&)>;
  using exit_fn = std::function<void(const exit_status&)>;

  /// Starts the process. `on_output` may block (flow control). Throws
  /// std::runtime_error with the OS error when the process cannot be started.
  child_process(const process_spec& spec, output_fn on_output, exit_fn on_exit);
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }
  /// Sends `sig` to the rank's process group unless it has already been reaped.
  void signal_group(int sig);

private:
  struct shared;
  std::shared_ptr<shared> shared_;
  pid_t pid_ = -1;
};

/// Raises this process's soft RLIMIT_NOFILE to the hard limit (a driver or agent holds
/// several descriptors per rank). Rank processes get the original soft limit back
/// (through caf-hvd-exec), so programs that use select() see what they always saw.
void raise_descriptor_limit();

/// Returns a TCP port that is free on this host right now (bound to 0 and released).
int find_free_port();

/// The CPU time (user and system, in clock ticks, the reaped children's included) used
/// so far by the process `root` and every process below it (found through each thread's
/// /proc/PID/task/TID/children). 0 when `root` is gone. A rank's sign of life: a process
/// in a long step uses CPU time; a blocked, stopped or hung one uses none.
uint64_t tree_cpu_ticks(int root);

/// Directory of the running executable (for locating caf-hvd-exec beside caf-hvd).
std::string executable_dir();

} // namespace cafhvd
