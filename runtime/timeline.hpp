// Draws a job's event log (runtime/event_log): a self-contained HTML page with one SVG
// lane per host and per rank (phases as bars on the job's lane, generations as bands,
// failures marked, details on hover), or Chrome's trace-event JSON for Perfetto and
// chrome://tracing.
#pragma once

#include <istream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cafhvd {

/// Reads JSON lines; throws std::runtime_error naming the line that is not an event.
std::vector<nlohmann::json> read_events(std::istream& in, const std::string& name);

/// The page: no scripts, no network access, everything inline.
std::string timeline_html(const std::vector<nlohmann::json>& events, const std::string& title);

/// {"traceEvents": [...]}: complete events per lane, instants for failures.
nlohmann::json timeline_trace(const std::vector<nlohmann::json>& events);

} // namespace cafhvd
