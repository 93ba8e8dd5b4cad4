// Text that comes from the network, made safe for where it goes: a terminal (escaped),
// JSON (never a throw on bytes that are not UTF-8), and the names a job knows its hosts by.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cafhvd {

/// `s` with every byte outside printable ASCII (and the backslash) written as \xNN, so
/// that escape sequences and line breaks from a client never reach an operator's terminal
/// or a log line as such; at most `max` bytes of `s` are shown ("..." marks the cut).
std::string printable(std::string_view s, size_t max = 256);

/// A host name as node agents take them (`caf-hvd node --name`): 1 to 255 letters,
/// digits, '.', '-' or '_'. Names in requests that are not such are refused before they
/// reach any log, event or message.
bool valid_host_name(std::string_view s);

/// JSON text that never throws: invalid UTF-8 is replaced (U+FFFD).
inline std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace cafhvd
