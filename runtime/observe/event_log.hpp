// A job's event log: one JSON object per line, {"timestamp": <seconds since the epoch>,
// "name": "...", "context": {...}} (the shape of Flux's RFC 21 eventlog), written as
// each event happens, so a crashed or killed job leaves every event up to its end.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cafhvd {

class event_log {
public:
  /// A disabled log: emit() does nothing.
  event_log() = default;
  /// Truncates `path` and writes to it. Throws std::runtime_error naming the path.
  explicit event_log(const std::string& path);
  ~event_log();
  event_log(const event_log&) = delete;
  event_log& operator=(const event_log&) = delete;
  event_log(event_log&& other) noexcept;
  event_log& operator=(event_log&& other) noexcept;

  bool enabled() const { return fd_ >= 0 || observer_ != nullptr; }
  /// Appends one event, stamped now, with one write (lines never interleave), and hands
  /// it to the observer.
  void emit(std::string_view name, nlohmann::json context = nlohmann::json::object());
  /// Also (or only) hands every event to `f` (the live view); called on the emitting
  /// thread.
  void observe(std::function<void(const nlohmann::json&)> f) { observer_ = std::move(f); }

private:
  int fd_ = -1;
  std::function<void(const nlohmann::json&)> observer_;
};

} // namespace cafhvd
