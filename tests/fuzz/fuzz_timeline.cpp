// Fuzz target: the event log replay behind `caf-hvd timeline`. Any bytes either are
// refused with std::runtime_error naming the line, or replay into events that draw as a
// page and as a Chrome trace; the page never carries a script or an unescaped tag from
// the log, whatever the events' names and contexts hold.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

#include "runtime/observe/timeline.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  std::vector<nlohmann::json> events;
  try {
    events = cafhvd::read_events(in, "fuzz.jsonl");
  } catch (const std::runtime_error&) {
    return 0;
  }
  auto page = cafhvd::timeline_html(events, "fuzz <b>title</b>");
  std::string lower = page;
  for (auto& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("<script") != std::string::npos || page.find("<b>title") != std::string::npos)
    std::abort();
  auto trace = cafhvd::timeline_trace(events);
  if (!trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    std::abort();
  (void)trace.dump();
  return 0;
}
