// An administrator's drain, kept by the node agent across its own restarts: a file in
// the agent's state directory (`caf-hvd node --state-dir`, /var/lib/caf-hvd in the
// package) that exists while the node is drained and says by whom. A restarted agent
// that finds it starts drained, whatever table it joins; an undrain removes it.
#pragma once

#include <optional>
#include <string>

namespace cafhvd {

/// The file's path in `dir`.
std::string drain_mark_path(const std::string& dir);

/// What the mark in `dir` says (who drained the node, and when), or nullopt when the node
/// is not drained. Throws std::runtime_error when the directory or file cannot be read
/// (a state directory the agent cannot read must not be taken for "not drained").
std::optional<std::string> read_drain_mark(const std::string& dir);

/// Writes (on) or removes (off) the mark; `why` is kept in it. Atomic: a crash leaves the
/// old mark or the new one. Returns "" or why it failed.
std::string write_drain_mark(const std::string& dir, bool on, const std::string& why);

} // namespace cafhvd
