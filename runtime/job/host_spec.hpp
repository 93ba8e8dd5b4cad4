// Host lists as users write them: `-H HOST:SLOTS,HOST:PORT:SLOTS` and horovodrun's
// hostfile format (`HOST[:PORT] slots=N`). Plain data plus parsers that explain errors.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cafhvd {

/// Default TCP port of a `caf-hvd node` agent.
inline constexpr uint16_t default_node_port = 24780;

/// One node agent of a job and the number of ranks it may run.
struct host_spec {
  std::string host; // DNS name or IPv4 address the driver connects to
  uint16_t port = default_node_port;
  uint32_t slots = 1;

  std::string endpoint() const { return host + ":" + std::to_string(port); }
  friend bool operator==(const host_spec&, const host_spec&) = default;
};

/// Raised for malformed host lists and hostfiles; the message names the offending text.
struct spec_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// The most slots `HOST:SLOTS` may give: a larger number is taken for a mistyped port.
inline constexpr uint32_t max_short_spec_slots = 512;

/// Parses `HOST:SLOTS` (at most max_short_spec_slots) or `HOST:PORT:SLOTS`.
host_spec parse_host_spec(std::string_view text, uint16_t default_port = default_node_port);

/// Parses a comma-separated list of specs; rejects empty items and duplicate endpoints.
std::vector<host_spec> parse_host_list(std::string_view text,
                                       uint16_t default_port = default_node_port);

/// Parses a hostfile: one `HOST[:PORT] [slots=N]` per line (slots default to 1, as
/// Open MPI does), `#` starts a comment, blank lines are skipped. `name` is used in
/// error messages.
std::vector<host_spec> parse_hostfile(std::istream& in, std::string_view name,
                                      uint16_t default_port = default_node_port);

/// Parses a host discovery script's output: one host per line as HOST (slots from
/// `slots_per_host`, which must then be given), HOST:SLOTS or HOST:PORT:SLOTS; blank
/// lines and `#` comments are skipped. At most 65536 lines of 1024 characters.
std::vector<host_spec> parse_discovery_output(std::string_view text,
                                              std::optional<uint32_t> slots_per_host,
                                              uint16_t default_port = default_node_port);

/// Splits at every `sep`, keeping empty pieces ("a,,b" -> "a", "", "b").
std::vector<std::string_view> split_on(std::string_view s, char sep);

/// Parses a decimal integer in [lo, hi]; `what` names the value in the error message.
long long parse_bounded_int(std::string_view text, long long lo, long long hi,
                            std::string_view what);

} // namespace cafhvd
