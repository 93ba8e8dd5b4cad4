// At most N log lines a minute, then how many were left out: a peer that sends garbage or
// forged messages in a loop cannot fill the log (the TLS refusals, the wire guard's and
// the actors' refused messages each keep one).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace cafhvd {

class line_budget {
public:
  explicit line_budget(unsigned per_minute = 20) : per_minute_(per_minute) {}

  /// Whether a line may be written now; when a new minute began, `left_out` is set to the
  /// lines the last one did not write.
  bool take(uint64_t& left_out) {
    std::lock_guard g{m_};
    auto now = std::chrono::steady_clock::now();
    if (now - window_ > std::chrono::minutes(1)) {
      window_ = now;
      lines_ = 0;
      left_out = dropped_;
      dropped_ = 0;
    }
    if (lines_ >= per_minute_) {
      ++dropped_;
      return false;
    }
    ++lines_;
    return true;
  }

private:
  std::mutex m_;
  unsigned per_minute_;
  std::chrono::steady_clock::time_point window_ = std::chrono::steady_clock::now();
  unsigned lines_ = 0;
  uint64_t dropped_ = 0;
};

} // namespace cafhvd
