// The live view of a running job (`--dashboard [ADDR:]PORT`): an HTTP server on its own
// thread that serves the job's timeline page (runtime/observe/timeline), drawn from the events
// it is handed as they happen. The page reloads itself every few seconds while the job
// runs and stops once the job has ended; it has no scripts and loads nothing (a
// Content-Security-Policy says so to the browser). Also /events.jsonl (the event log so
// far) and /trace.json (Chrome's trace format).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cafhvd {

struct dashboard_options {
  std::string bind = "127.0.0.1";
  uint16_t port = 0; // 0 = a free port
  std::string title = "caf-hvd job";
  int refresh_seconds = 2;
  // Host headers served besides IP literals and "localhost" (`--dashboard-name`): any
  // other name is refused (421), so a web page cannot read the view through a name it
  // rebinds to this address (DNS rebinding).
  std::vector<std::string> names;
  // Connections at once; a new one beyond it closes the oldest still reading its request.
  size_t max_connections = 64;
};

/// Whether a request's Host header value (`host[:port]`) may be served: an IP literal,
/// "localhost", or one of `names` (case-insensitive). The port is not checked: an ssh
/// tunnel forwards from a port of its own.
bool dashboard_host_allowed(const std::string& host_header, const std::vector<std::string>& names);

/// "PORT", "ADDR:PORT" or "[V6ADDR]:PORT" -> (address, port); loopback when no address
/// is given. Throws std::invalid_argument saying what is wrong.
std::pair<std::string, uint16_t> parse_dashboard_address(const std::string& spec);

/// Whether `address` is a loopback address (127.0.0.0/8, ::1, "localhost"), IPv6 too.
bool dashboard_is_loopback(const std::string& address);

class dashboard {
public:
  /// Listens at once; throws std::runtime_error naming the address when it cannot.
  explicit dashboard(dashboard_options o);
  ~dashboard(); // stops serving and joins the server's thread
  dashboard(const dashboard&) = delete;
  dashboard& operator=(const dashboard&) = delete;

  uint16_t port() const;
  const std::string& address() const;
  /// Adds one event (thread-safe); the next request draws it.
  void add(const nlohmann::json& event);
  /// Requests answered so far (tests).
  uint64_t requests() const;
  /// Connections open now (tests).
  size_t connections() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace cafhvd
