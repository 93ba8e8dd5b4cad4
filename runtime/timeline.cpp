// Timeline rendering: events -> lanes of intervals -> SVG or trace events.
#include "runtime/timeline.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

namespace cafhvd {

namespace {

struct interval {
  double begin = 0, end = 0;
  std::string label;  // drawn inside the bar when it fits
  std::string detail; // hover text
  std::string color;
};

struct lane {
  std::string name;
  std::vector<interval> bars;
};

struct model {
  double t0 = 0, t1 = 0;
  std::vector<lane> lanes; // job, hosts, ranks (slots)
  std::vector<interval> generations;
  std::vector<std::pair<double, std::string>> failures;
};

std::string xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

std::string str(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null())
    return {};
  return it->is_string() ? it->get<std::string>() : it->dump();
}

model build(const std::vector<nlohmann::json>& events) {
  model m;
  if (events.empty())
    return m;
  m.t0 = events.front().at("timestamp").get<double>();
  m.t1 = events.back().at("timestamp").get<double>();
  lane job{"job", {}};
  std::map<std::string, size_t> host_lane, slot_lane;
  std::vector<lane> hosts, slots;
  std::map<std::string, double> phase_open, host_open, slot_open;
  std::map<std::string, std::string> slot_rank;
  std::optional<std::pair<double, std::string>> gen_open;
  auto host_of = [&](const std::string& h) -> lane& {
    auto [it, fresh] = host_lane.try_emplace(h, hosts.size());
    if (fresh)
      hosts.push_back({"host " + h, {}});
    return hosts[it->second];
  };
  auto slot_of = [&](const std::string& s) -> lane& {
    auto [it, fresh] = slot_lane.try_emplace(s, slots.size());
    if (fresh)
      slots.push_back({"slot " + s, {}});
    return slots[it->second];
  };
  for (auto& e : events) {
    double t = e.at("timestamp").get<double>();
    auto& name = e.at("name").get_ref<const std::string&>();
    auto& c = e.at("context");
    if (name == "phase.begin") {
      phase_open[str(c, "phase")] = t;
    } else if (name == "phase.end") {
      auto p = str(c, "phase");
      if (auto it = phase_open.find(p); it != phase_open.end()) {
        job.bars.push_back({it->second, t, p,
                            fmt::format("phase {}: {:.1f} ms", p, (t - it->second) * 1000),
                            "#8fb3de"});
        phase_open.erase(it);
      }
    } else if (name == "host.ready") {
      auto h = str(c, "host");
      host_of(h);
      host_open[h] = t;
      host_of(h).bars.push_back({t, t, "",
                                 fmt::format("{} ready: interfaces {}, reached at {}", h,
                                             str(c, "interfaces"), str(c, "address")),
                                 "#6aa84f"});
    } else if (name == "host.lost" || name == "host.blacklisted") {
      auto h = str(c, "host");
      auto& l = host_of(h);
      double from = host_open.count(h) ? host_open[h] : t;
      host_open.erase(h);
      l.bars.push_back({from, t, "", "", "#6aa84f"});
      l.bars.push_back({t, t, name == "host.lost" ? "lost" : "blacklisted",
                        fmt::format("{} {}: {}", h, name.substr(5), c.dump()), "#cc0000"});
    } else if (name == "rank.started") {
      auto s = str(c, "slot");
      slot_of(s);
      slot_open[s] = t;
      slot_rank[s] = str(c, "rank");
    } else if (name == "rank.ended") {
      auto s = str(c, "slot");
      auto& l = slot_of(s);
      double from = slot_open.count(s) ? slot_open[s] : m.t0;
      slot_open.erase(s);
      int code = c.value("code", 0);
      bool retired = c.value("retired", false);
      l.bars.push_back(
          {from, t, fmt::format("rank {}", str(c, "rank")),
           fmt::format("rank {} on {} (slot {}), generation {}: {}{}", str(c, "rank"),
                       str(c, "host"), s, str(c, "generation"),
                       code == 0 ? std::string{"exit 0"}
                                 : fmt::format("code {} (signal {})", code, str(c, "signal")),
                       retired ? ", left the job" : ""),
           code == 0 ? "#6aa84f"
           : retired ? "#999999"
                     : "#cc0000"});
    } else if (name == "generation.begin") {
      if (gen_open)
        m.generations.push_back({gen_open->first, t, gen_open->second, "", "#f3f3f3"});
      gen_open = {t, fmt::format("generation {} ({} ranks on {})", str(c, "generation"),
                                 str(c, "size"), str(c, "hosts"))};
    } else if (name == "failure") {
      m.failures.push_back({t, str(c, "cause")});
    }
  }
  if (gen_open)
    m.generations.push_back({gen_open->first, m.t1, gen_open->second, "", "#f3f3f3"});
  for (auto& [h, from] : host_open)
    hosts[host_lane[h]].bars.push_back({from, m.t1, "", "", "#6aa84f"});
  for (auto& [s, from] : slot_open)
    slots[slot_lane[s]].bars.push_back(
        {from, m.t1, fmt::format("rank {}", slot_rank[s]), "still running", "#f1c232"});
  for (auto& [p, from] : phase_open)
    job.bars.push_back({from, m.t1, p, "phase " + p, "#8fb3de"});
  m.lanes.push_back(std::move(job));
  for (auto& l : hosts)
    m.lanes.push_back(std::move(l));
  for (auto& l : slots)
    m.lanes.push_back(std::move(l));
  return m;
}

} // namespace

std::vector<nlohmann::json> read_events(std::istream& in, const std::string& name) {
  std::vector<nlohmann::json> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty())
      continue;
    nlohmann::json e;
    try {
      e = nlohmann::json::parse(line);
    } catch (const std::exception& ex) {
      throw std::runtime_error(fmt::format("{}:{}: not JSON: {}", name, n, ex.what()));
    }
    if (!e.is_object() || !e.contains("timestamp") || !e["timestamp"].is_number()
        || !e.contains("name") || !e["name"].is_string() || !e.contains("context")
        || !e["context"].is_object())
      throw std::runtime_error(
          fmt::format("{}:{}: not an event (expected timestamp, name and context)", name, n));
    out.push_back(std::move(e));
  }
  if (out.empty())
    throw std::runtime_error(fmt::format("{}: no events", name));
  return out;
}

std::string timeline_html(const std::vector<nlohmann::json>& events, const std::string& title) {
  auto m = build(events);
  const double left = 200, width = 1000, lane_h = 24, top = 30;
  double span = std::max(m.t1 - m.t0, 1e-6);
  auto x = [&](double t) { return left + (t - m.t0) / span * width; };
  double height = top + lane_h * static_cast<double>(m.lanes.size()) + 20;
  std::string svg =
      fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n",
                  left + width + 20, height);
  for (auto& g : m.generations)
    svg +=
        fmt::format("<g class=\"generation\"><rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" "
                    "height=\"{}\" fill=\"{}\" stroke=\"#cccccc\"/><text x=\"{:.1f}\" y=\"{}\">"
                    "{}</text><title>{}</title></g>\n",
                    x(g.begin), top - 16, std::max(x(g.end) - x(g.begin), 1.0), height - top + 16,
                    g.color, x(g.begin) + 3, top - 4, xml(g.label), xml(g.label));
  for (size_t i = 0; i < m.lanes.size(); ++i) {
    double y = top + lane_h * static_cast<double>(i);
    auto& l = m.lanes[i];
    svg += fmt::format("<g class=\"lane\"><text x=\"4\" y=\"{:.1f}\">{}</text>\n", y + 16,
                       xml(l.name));
    for (auto& b : l.bars) {
      double w = std::max(x(b.end) - x(b.begin), 2.0);
      svg += fmt::format("<g><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" "
                         "fill=\"{}\"/>",
                         x(b.begin), y + 3, w, lane_h - 6, b.color);
      if (!b.label.empty() && w > 7.0 * static_cast<double>(b.label.size()))
        svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>", x(b.begin) + 3, y + 16,
                           xml(b.label));
      svg += fmt::format("<title>{}</title></g>\n", xml(b.detail.empty() ? b.label : b.detail));
    }
    svg += "</g>\n";
  }
  for (auto& [t, cause] : m.failures)
    svg += fmt::format("<g class=\"failure\"><line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" "
                       "y2=\"{2}\" stroke=\"#cc0000\" stroke-width=\"2\"/><title>failure: {3}"
                       "</title></g>\n",
                       x(t), top - 16, height, xml(cause));
  svg += fmt::format("<text x=\"{}\" y=\"{}\">0 ms</text><text x=\"{}\" y=\"{}\" "
                     "text-anchor=\"end\">{:.1f} ms</text>\n</svg>\n",
                     left, height - 4, left + width, height - 4, span * 1000);
  return fmt::format("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{0}</title>"
                     "<style>body{{font-family:sans-serif;margin:16px}}</style></head>\n"
                     "<body><h1>{0}</h1><p>{1} events over {2:.1f} ms; hover for details.</p>\n"
                     "{3}</body></html>\n",
                     xml(title), events.size(), span * 1000, svg);
}

nlohmann::json timeline_trace(const std::vector<nlohmann::json>& events) {
  auto m = build(events);
  auto us = [&](double t) { return (t - m.t0) * 1e6; };
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < m.lanes.size(); ++i) {
    out.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", 1},
                   {"tid", i},
                   {"args", {{"name", m.lanes[i].name}}}});
    for (auto& b : m.lanes[i].bars)
      out.push_back({{"name", b.label.empty() ? m.lanes[i].name : b.label},
                     {"ph", "X"},
                     {"pid", 1},
                     {"tid", i},
                     {"ts", us(b.begin)},
                     {"dur", std::max(us(b.end) - us(b.begin), 1.0)},
                     {"args", {{"detail", b.detail}}}});
  }
  for (auto& g : m.generations)
    out.push_back({{"name", g.label},
                   {"ph", "X"},
                   {"pid", 2},
                   {"tid", 0},
                   {"ts", us(g.begin)},
                   {"dur", std::max(us(g.end) - us(g.begin), 1.0)}});
  for (auto& [t, cause] : m.failures)
    out.push_back({{"name", "failure"},
                   {"ph", "i"},
                   {"s", "g"},
                   {"pid", 1},
                   {"tid", 0},
                   {"ts", us(t)},
                   {"args", {{"cause", cause}}}});
  return {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
}

} // namespace cafhvd
