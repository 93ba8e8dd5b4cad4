// What a node agent keeps across its own restarts, in its state directory (`caf-hvd node
// --state-dir`, /var/lib/caf-hvd in the package):
// - DIR/drained, an administrator's drain: it exists while the node is drained and says
//   by whom; a restarted agent that finds it starts drained, whatever table it joins; an
//   undrain removes it;
// - DIR/members, on the agent that holds the table: its members' names, which a
//   restarted table waits for before its answers are final;
// - DIR/placements, on that agent too: the slots the table holds for placed jobs whose
//   ranks have not started, and the jobs waiting in line (membership_table's record).
#pragma once

#include <optional>
#include <string>
#include <vector>

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

/// The names of the members the table held by this agent had (DIR/members, one per
/// line), kept so that a restarted table knows whom to wait for. Empty when none are kept.
std::vector<std::string> read_table_members(const std::string& dir);
/// Replaces the list (atomically). Returns "" or why it failed.
std::string write_table_members(const std::string& dir, const std::vector<std::string>& names);

/// The table's placements record (DIR/placements), or "" when none is kept.
std::string read_table_placements(const std::string& dir);
/// Replaces it (atomically). Returns "" or why it failed.
std::string write_table_placements(const std::string& dir, const std::string& text);

} // namespace cafhvd
