// Writes a driver's output on a thread of its own: a stalled reader (a full pipe, a
// paused `| less`) blocks only this thread, never the actor that owns the job, so exits,
// deadlines and Ctrl-C are handled while output waits. Writes keep their order across
// all descriptors.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace cafhvd {

/// Writes all of `bytes` to `fd` (retrying short writes and EINTR); false when the
/// reader is gone or the write failed otherwise.
bool write_fully(int fd, std::string_view bytes);

class output_writer {
public:
  output_writer();
  /// Writes everything queued, then stops.
  ~output_writer();
  output_writer(const output_writer&) = delete;
  output_writer& operator=(const output_writer&) = delete;

  /// Queues `bytes` for `fd`; `done` (if any) runs on the writer's thread once they are
  /// written, or dropped because the reader is gone (EPIPE and other errors).
  void write(int fd, std::string bytes, std::function<void()> done = {});
  /// Closes `fd` after what was queued for it before.
  void close_after(int fd);
  /// Blocks until everything queued so far is written.
  void flush();
  /// Bytes queued and not yet written.
  size_t pending() const;

private:
  struct item {
    int fd;
    std::string bytes;
    std::function<void()> done;
    bool close = false;
  };
  void run();

  mutable std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<item> queue_;
  size_t pending_ = 0;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace cafhvd
