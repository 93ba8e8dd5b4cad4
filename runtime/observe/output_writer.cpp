// output_writer: one thread, one FIFO queue.
#include "runtime/observe/output_writer.hpp"

#include <cerrno>
#include <unistd.h>

namespace cafhvd {

bool write_fully(int fd, std::string_view s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    auto n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

output_writer::output_writer() : thread_([this] { run(); }) {}

output_writer::~output_writer() {
  {
    std::lock_guard<std::mutex> g{m_};
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void output_writer::write(int fd, std::string bytes, std::function<void()> done) {
  {
    std::lock_guard<std::mutex> g{m_};
    pending_ += bytes.size();
    queue_.push_back({fd, std::move(bytes), std::move(done)});
  }
  cv_.notify_one();
}

void output_writer::close_after(int fd) {
  {
    std::lock_guard<std::mutex> g{m_};
    queue_.push_back({fd, {}, {}, true});
  }
  cv_.notify_one();
}

void output_writer::flush() {
  std::unique_lock<std::mutex> l{m_};
  idle_.wait(l, [&] { return queue_.empty() && !busy_; });
}

size_t output_writer::pending() const {
  std::lock_guard<std::mutex> g{m_};
  return pending_;
}

void output_writer::run() {
  std::unique_lock<std::mutex> l{m_};
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_)
        return;
      continue;
    }
    auto it = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    l.unlock();
    if (it.close)
      ::close(it.fd);
    else
      write_fully(it.fd, it.bytes); // a reader that is gone loses output, never the job
    if (it.done)
      it.done();
    l.lock();
    pending_ -= it.bytes.size();
    busy_ = false;
    if (queue_.empty())
      idle_.notify_all();
  }
}

} // namespace cafhvd
