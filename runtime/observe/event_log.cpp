// event_log: one write(2) per event on an O_APPEND descriptor.
#include "runtime/observe/event_log.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

#include "runtime/observe/output_writer.hpp"

namespace cafhvd {

event_log::event_log(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(
        fmt::format("cannot write the event log {}: {}", path, std::strerror(errno)));
}

event_log::~event_log() {
  if (fd_ >= 0)
    ::close(fd_);
}

event_log::event_log(event_log&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), observer_(std::move(other.observer_)) {}

event_log& event_log::operator=(event_log&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    observer_ = std::move(other.observer_);
  }
  return *this;
}

void event_log::emit(std::string_view name, nlohmann::json context) {
  if (!enabled())
    return;
  auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch());
  nlohmann::json ev{{"timestamp", now.count()}, {"name", name}, {"context", std::move(context)}};
  if (fd_ >= 0) {
    auto line = ev.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    write_fully(fd_, line); // a full disk loses events, never the job
  }
  if (observer_)
    observer_(ev);
}

} // namespace cafhvd
