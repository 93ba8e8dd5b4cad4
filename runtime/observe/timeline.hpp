// Draws a job's event log (runtime/observe/event_log): a self-contained HTML page (inline SVG and
// tables, no scripts, no network access) or Chrome's trace-event JSON for Perfetto and
// chrome://tracing.
//
// The page: a lane for the job (a static job's phases; an elastic job's waiting, barrier
// and running stretches), one per host in the job's host order (ready until it ended,
// was lost, blacklisted or removed) and one per slot (each process a bar split at every
// generation it lived through, labelled with its rank there, coloured by how it ended);
// generations as bands; markers with words for joins, losses, blacklisting, cooldown
// ends, releases and failures; a legend; and tables of hosts, generations, processes by
// outcome and the exit.
#pragma once

#include <istream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cafhvd {

/// Reads JSON lines; throws std::runtime_error naming the line that is not an event.
std::vector<nlohmann::json> read_events(std::istream& in, const std::string& name);

struct timeline_options {
  /// > 0: the page reloads itself after this many seconds (the live view of a job that
  /// is still running); the page says whether the job has ended.
  int refresh_seconds = 0;
  /// > 0 (seconds since the epoch): a live page's "now"; until the job has ended, the
  /// picture runs to it (running processes grow) rather than to the last event.
  double now = 0;
};

/// The page: no scripts, no network access, everything inline.
std::string timeline_html(const std::vector<nlohmann::json>& events, const std::string& title,
                          const timeline_options& opts = {});

/// {"traceEvents": [...]}: complete events per lane (a process's segments named by
/// rank), instants with words for the markers, generations on their own track.
nlohmann::json timeline_trace(const std::vector<nlohmann::json>& events);

} // namespace cafhvd
