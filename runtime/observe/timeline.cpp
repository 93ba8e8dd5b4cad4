// Timeline rendering: events -> a model (lanes of segments, generations, markers, hosts,
// outcomes) -> SVG and tables, or trace events.
#include "runtime/observe/timeline.hpp"
#include "runtime/observe/text.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cafhvd {

namespace {

// How a process (or a stretch of it) ended; each has a colour and a legend entry.
enum class outcome { ok, failed, stopped, left, lost, running };

struct outcome_style {
  const char* cls;
  const char* color;
  const char* legend;
};

outcome_style style(outcome o) {
  switch (o) {
  case outcome::ok:
    return {"ok", "#6aa84f", "exit 0"};
  case outcome::failed:
    return {"failed", "#cc0000", "failed (non-zero exit, signal, or could not start)"};
  case outcome::stopped:
    return {"stopped", "#e69138", "stopped by the launcher (the job was ending)"};
  case outcome::left:
    return {"left", "#999999", "left the job (its slot is not in the new generation)"};
  case outcome::lost:
    return {"lost", "#674ea7", "lost with its host (no exit seen)"};
  case outcome::running:
    return {"running", "#f1c232", "running (no exit seen yet)"};
  }
  return {"", "", ""};
}

constexpr outcome all_outcomes[] = {outcome::ok,   outcome::failed, outcome::stopped,
                                    outcome::left, outcome::lost,   outcome::running};

struct segment {
  double begin = 0, end = 0;
  std::string label;  // drawn inside the bar when it fits
  std::string detail; // hover text
  std::string color;
  std::string cls; // for the page's structure (and tests): an outcome or a job stretch
};

struct lane {
  std::string name;
  std::vector<segment> bars;
};

struct marker {
  double t = 0;
  std::string kind; // join, lost, blacklisted, returned, released, failure, removed
  std::string text; // the words drawn
  std::string detail;
};

struct generation_info {
  int number = 0;
  size_t size = 0;
  std::vector<std::string> hosts, added, removed;
  std::string reason;
  double begin = 0;
  std::optional<double> released;
  double end = 0;
  std::map<std::string, int> rank_of_slot; // slot key -> rank in this generation
};

struct host_info {
  std::string name, endpoint;
  std::optional<double> ready; // since (when up)
  double first_seen = 0;
  std::string ending = "to the end of the job";
  bool up = false;
};

struct process {
  std::string slot, host;
  double begin = 0;
  int rank = -1;
  int generation = 0;
  std::string pid;
};

struct model {
  double t0 = 0, t1 = 0;
  std::string kind = "static";
  std::vector<lane> lanes; // job, hosts, slots
  std::vector<generation_info> generations;
  std::vector<marker> markers;
  std::vector<host_info> hosts; // in the job's host order
  std::map<outcome, int> outcomes;
  std::optional<int> exit_code;
  std::string cause;
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

// A value as plain text: strings as they are, lists joined with ", ", numbers printed.
std::string text(const nlohmann::json& v) {
  if (v.is_null())
    return {};
  if (v.is_string())
    return v.get<std::string>();
  if (v.is_array()) {
    std::vector<std::string> parts;
    for (auto& x : v)
      parts.push_back(text(x));
    return fmt::format("{}", fmt::join(parts, ", "));
  }
  if (v.is_object()) {
    std::vector<std::string> parts;
    for (auto& [k, x] : v.items())
      parts.push_back(fmt::format("{} {}", k, text(x)));
    return fmt::format("{}", fmt::join(parts, ", "));
  }
  return json_text(v);
}

std::string str(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  return it == c.end() ? std::string{} : text(*it);
}

std::vector<std::string> strings(const nlohmann::json& c, const char* key) {
  std::vector<std::string> out;
  auto it = c.find(key);
  if (it != c.end() && it->is_array())
    for (auto& x : *it)
      out.push_back(text(x));
  return out;
}

int integer(const nlohmann::json& c, const char* key, int fallback = -1) {
  auto it = c.find(key);
  return it != c.end() && it->is_number() ? it->get<int>() : fallback;
}

// "ha:0" -> ("ha", 0) for ordering slots by host order, then local rank.
std::pair<std::string, int> split_slot(const std::string& slot) {
  auto colon = slot.rfind(':');
  if (colon == std::string::npos)
    return {slot, 0};
  try {
    return {slot.substr(0, colon), std::stoi(slot.substr(colon + 1))};
  } catch (const std::exception&) {
    return {slot.substr(0, colon), 0};
  }
}

std::string seconds(double s) {
  return s < 10 ? fmt::format("{:.2f} s", s) : fmt::format("{:.1f} s", s);
}

class builder {
public:
  model build(const std::vector<nlohmann::json>& events, double now) {
    if (events.empty())
      return std::move(m_);
    m_.t0 = events.front().at("timestamp").get<double>();
    m_.t1 = events.back().at("timestamp").get<double>();
    for (auto& e : events)
      on(e.at("timestamp").get<double>(), e.at("name").get_ref<const std::string&>(),
         e.at("context"));
    if (!m_.exit_code && now > m_.t1)
      m_.t1 = now; // a live page of a running job: up to now
    finish();
    return std::move(m_);
  }

private:
  model m_;
  lane job_{"job", {}};
  std::map<std::string, host_info> hosts_;  // by name
  std::vector<std::string> endpoint_order_; // the job's host order (endpoints)
  std::map<std::string, std::string> name_of_endpoint_;
  std::map<std::string, lane> slots_;
  std::map<std::string, process> open_; // slot -> its running process
  std::map<std::string, double> phase_open_;
  std::optional<double> failure_at_;
  std::set<std::string> failure_causes_;
  std::optional<double> teardown_at_;
  int first_event_order_ = 0;
  std::map<std::string, int> seen_order_;

  double rel(double t) const { return t - m_.t0; }

  host_info& host(const std::string& name, double t) {
    auto [it, fresh] = hosts_.try_emplace(name);
    if (fresh) {
      it->second.name = name;
      it->second.first_seen = t;
      seen_order_[name] = first_event_order_++;
    }
    return it->second;
  }

  lane& slot_lane(const std::string& slot) {
    auto [it, fresh] = slots_.try_emplace(slot);
    if (fresh)
      it->second.name = "slot " + slot;
    return it->second;
  }

  generation_info* generation(int n) {
    for (auto& g : m_.generations)
      if (g.number == n)
        return &g;
    return nullptr;
  }

  void mark(double t, std::string kind, std::string words, std::string detail = {}) {
    m_.markers.push_back({t, std::move(kind), std::move(words), std::move(detail)});
  }

  // Ends `name`'s "up" bar at t (lost, blacklisted, removed).
  void host_down(const std::string& name, double t, const std::string& ending) {
    auto& h = host(name, t);
    if (h.up && h.ready) {
      host_lane(name).bars.push_back(
          {*h.ready, t, "",
           fmt::format("{} ready {} to {}", name, seconds(rel(*h.ready)), seconds(rel(t))),
           "#b6d7a8", "up"});
    }
    h.up = false;
    h.ending = ending;
  }

  std::map<std::string, lane> host_lanes_;
  lane& host_lane(const std::string& name) {
    auto [it, fresh] = host_lanes_.try_emplace(name);
    if (fresh)
      it->second.name = "host " + name;
    return it->second;
  }

  // The segments of one process: split at each release of a later generation it lived
  // through, each labelled with its rank there.
  void close_process(const std::string& slot, double t, outcome o, const std::string& how) {
    auto it = open_.find(slot);
    if (it == open_.end())
      return;
    auto p = it->second;
    open_.erase(it);
    auto& l = slot_lane(slot);
    double from = p.begin;
    int rank = p.rank;
    int gen = p.generation;
    auto st = style(o);
    for (auto& g : m_.generations) {
      if (g.number <= p.generation || !g.released || *g.released <= from || *g.released >= t)
        continue;
      l.bars.push_back({from, *g.released, fmt::format("rank {}", rank),
                        fmt::format("rank {} on {} (slot {}), generation {}, pid {}", rank, p.host,
                                    slot, gen, p.pid),
                        "#6fa8dc", "carried"});
      from = *g.released;
      gen = g.number;
      auto r = g.rank_of_slot.find(slot);
      rank = r == g.rank_of_slot.end() ? -1 : r->second;
    }
    l.bars.push_back({from, t, rank >= 0 ? fmt::format("rank {}", rank) : "leaving",
                      fmt::format("{} on {} (slot {}), generation {}, pid {}: {}",
                                  rank >= 0 ? fmt::format("rank {}", rank) : "leaving the job",
                                  p.host, slot, gen, p.pid, how),
                      st.color, st.cls});
    ++m_.outcomes[o];
  }

  void on(double t, const std::string& name, const nlohmann::json& c) {
    if (name == "job.start") {
      m_.kind = str(c, "kind").empty() ? "static" : str(c, "kind");
      endpoint_order_ = strings(c, "hosts");
    } else if (name == "discovery") {
      for (auto& ep : strings(c, "hosts"))
        if (std::find(endpoint_order_.begin(), endpoint_order_.end(), ep) == endpoint_order_.end())
          endpoint_order_.push_back(ep);
    } else if (name == "phase.begin") {
      auto p = str(c, "phase");
      phase_open_[p] = t;
      if (p == "teardown")
        teardown_at_ = t;
    } else if (name == "phase.end") {
      auto p = str(c, "phase");
      if (auto it = phase_open_.find(p); it != phase_open_.end()) {
        if (m_.kind == "static" || p == "teardown")
          job_.bars.push_back({it->second, t, p,
                               fmt::format("{}: {:.1f} ms", p, (t - it->second) * 1000), "#8fb3de",
                               "phase"});
        phase_open_.erase(it);
      }
    } else if (name == "host.ready") {
      auto n = str(c, "host");
      auto& h = host(n, t);
      h.endpoint = str(c, "endpoint");
      name_of_endpoint_[h.endpoint] = n;
      if (h.up && h.ready) // ready again without a loss seen: close the earlier stretch
        host_down(n, t, h.ending);
      h.ready = t;
      h.up = true;
      h.ending = "to the end of the job";
      host_lane(n);
    } else if (name == "host.lost") {
      auto n = str(c, "host");
      auto cause = str(c, "cause");
      host_down(n, t, fmt::format("lost at {}: {}", seconds(rel(t)), cause));
      host_lane(n).bars.push_back({t, t, "lost", n + " lost: " + cause, "#674ea7", "lost"});
      mark(t, "lost", "lost " + n, cause);
      std::vector<std::string> gone;
      for (auto& [slot, p] : open_)
        if (p.host == n)
          gone.push_back(slot);
      for (auto& slot : gone)
        close_process(slot, t, outcome::lost, "its host was lost (" + cause + ")");
    } else if (name == "host.blacklisted") {
      auto n = str(c, "host");
      auto cool = c.find("cooldown_seconds");
      auto until = cool == c.end() || cool->is_null() ? std::string{"for the rest of the job"}
                                                      : fmt::format("for {} s", text(*cool));
      if (auto& h = host(n, t); !h.up && h.ending.rfind("lost", 0) == 0)
        h.ending += fmt::format("; blacklisted {}", until);
      else
        host_down(n, t, fmt::format("blacklisted at {} {}", seconds(rel(t)), until));
      host_lane(n).bars.push_back(
          {t, t, "blacklisted",
           fmt::format("{} blacklisted {} after {} failure(s)", n, until, str(c, "failures")),
           "#cc0000", "blacklisted"});
      mark(t, "blacklisted", "blacklisted " + n, until);
    } else if (name == "host.returned") {
      auto n = str(c, "host");
      auto& h = host(n, t);
      h.ending = "to the end of the job";
      if (!h.up) { // usable again (its agent stayed connected, or connects again)
        h.up = true;
        h.ready = t;
      }
      mark(t, "returned", "cooldown over: " + n);
    } else if (name == "generation.begin") {
      generation_info g;
      g.number = integer(c, "generation", static_cast<int>(m_.generations.size()) + 1);
      g.size = static_cast<size_t>(std::max(0, integer(c, "size", 0)));
      g.hosts = strings(c, "hosts");
      g.added = strings(c, "added");
      g.removed = strings(c, "removed");
      g.reason = str(c, "reason");
      g.begin = t;
      if (auto plan = c.find("plan"); plan != c.end() && plan->is_array())
        for (auto& row : *plan)
          if (row.is_object())
            g.rank_of_slot[fmt::format("{}:{}", str(row, "host"), integer(row, "local_rank", 0))] =
                integer(row, "rank");
      if (!m_.generations.empty())
        m_.generations.back().end = t;
      if (g.number > 1 && !g.added.empty())
        mark(t, "join", fmt::format("join: {}", fmt::join(g.added, ", ")),
             fmt::format("generation {} adds {}", g.number, fmt::join(g.added, ", ")));
      for (auto& r : g.removed) {
        auto it = hosts_.find(r);
        if (it != hosts_.end() && it->second.up)
          host_down(r, t, fmt::format("removed at {} (generation {})", seconds(rel(t)), g.number));
        if (g.number > 1)
          mark(t, "removed", "removed " + r);
      }
      m_.generations.push_back(std::move(g));
    } else if (name == "generation.released") {
      if (auto* g = generation(integer(c, "generation"))) {
        g->released = t;
        if (m_.kind == "elastic" && g->number > 1)
          mark(t, "released", fmt::format("generation {} released", g->number));
      }
    } else if (name == "rank.started") {
      auto slot = str(c, "slot");
      slot_lane(slot);
      process p;
      p.slot = slot;
      p.host = str(c, "host");
      p.begin = t;
      p.rank = integer(c, "rank");
      p.generation = integer(c, "generation", 1);
      p.pid = str(c, "pid");
      if (open_.count(slot)) // a start without the previous end: draw what is known
        close_process(slot, t, outcome::running, "no exit seen before the slot started again");
      open_[slot] = p;
    } else if (name == "rank.ended") {
      auto slot = str(c, "slot");
      int code = integer(c, "code", 0);
      int sig = integer(c, "signal", 0);
      bool retired = c.value("retired", false);
      auto stopped_by = str(c, "stopped_by");
      auto exec_error = str(c, "exec_error");
      outcome o = code == 0 ? outcome::ok
                  : retired ? outcome::left
                  : (!stopped_by.empty() || (failure_at_ && (sig == 15 || sig == 9)))
                      ? outcome::stopped
                      : outcome::failed;
      std::string how = code == 0 ? "exit 0"
                        : sig > 0 ? fmt::format("signal {} (code {})", sig, code)
                                  : fmt::format("exit code {}", code);
      if (!exec_error.empty())
        how += ", " + exec_error;
      if (!stopped_by.empty())
        how += ", stopped by " + stopped_by;
      if (!open_.count(slot)) {
        if (hosts_.count(str(c, "host")) == 0 || hosts_.at(str(c, "host")).up) {
          // an end whose start is not in the log (it began before the log did)
          process p;
          p.slot = slot;
          p.host = str(c, "host");
          p.begin = m_.t0;
          p.rank = integer(c, "rank");
          p.generation = integer(c, "generation", 1);
          open_[slot] = p;
        } else {
          return; // drawn as lost with its host already
        }
      }
      close_process(slot, t, o, how);
    } else if (name == "failure") {
      if (!failure_at_)
        failure_at_ = t;
      auto cause = str(c, "cause");
      // the failure that ends a job is logged again as what ended it, and ranks the
      // teardown stopped are logged too: a marker for each failure before the teardown
      if (failure_causes_.insert(cause).second && !teardown_at_)
        mark(t, "failure", "failure", cause);
    } else if (name == "job.end") {
      m_.exit_code = integer(c, "code", 0);
      m_.cause = str(c, "cause");
    }
  }

  void finish() {
    double end = m_.t1;
    if (!m_.generations.empty())
      m_.generations.back().end = end;
    std::vector<std::string> running;
    for (auto& [slot, p] : open_)
      running.push_back(slot);
    for (auto& slot : running)
      close_process(slot, end, outcome::running,
                    m_.exit_code ? "no exit seen before the job ended" : "still running");
    for (auto& [n, h] : hosts_)
      if (h.up && h.ready)
        host_lane(n).bars.push_back({*h.ready, end, "", n + " ready", "#b6d7a8", "up"});
    for (auto& [p, from] : phase_open_)
      job_.bars.push_back({from, end, p, p + " (not ended)", "#8fb3de", "phase"});
    if (m_.kind == "elastic")
      elastic_stretches();
    std::sort(job_.bars.begin(), job_.bars.end(),
              [](auto& a, auto& b) { return a.begin < b.begin; });

    // Hosts in the job's order (its -H list or discovery output), then any other by
    // first appearance.
    std::vector<std::string> order;
    for (auto& ep : endpoint_order_) {
      auto it = name_of_endpoint_.find(ep);
      auto n = it == name_of_endpoint_.end() ? ep : it->second;
      if (hosts_.count(n) && std::find(order.begin(), order.end(), n) == order.end())
        order.push_back(n);
    }
    std::vector<std::pair<int, std::string>> rest;
    for (auto& [n, h] : hosts_)
      if (std::find(order.begin(), order.end(), n) == order.end())
        rest.push_back({seen_order_[n], n});
    std::sort(rest.begin(), rest.end());
    for (auto& [_, n] : rest)
      order.push_back(n);
    auto rank_of_host = [&](const std::string& n) {
      auto it = std::find(order.begin(), order.end(), n);
      return it == order.end() ? order.size() : static_cast<size_t>(it - order.begin());
    };

    m_.lanes.push_back(std::move(job_));
    for (auto& n : order) {
      m_.hosts.push_back(hosts_.at(n));
      auto& l = host_lane(n);
      std::sort(l.bars.begin(), l.bars.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
      m_.lanes.push_back(l);
    }
    std::vector<std::string> slot_names;
    for (auto& [s, _] : slots_)
      slot_names.push_back(s);
    std::sort(slot_names.begin(), slot_names.end(), [&](auto& a, auto& b) {
      auto [ha, la] = split_slot(a);
      auto [hb, lb] = split_slot(b);
      return std::make_tuple(rank_of_host(ha), ha, la) < std::make_tuple(rank_of_host(hb), hb, lb);
    });
    for (auto& s : slot_names)
      m_.lanes.push_back(std::move(slots_.at(s)));
    std::stable_sort(m_.markers.begin(), m_.markers.end(),
                     [](auto& a, auto& b) { return a.t < b.t; });
  }

  // An elastic job's lane: waiting for enough hosts, each generation's barrier (formed,
  // not yet released) and its running stretch.
  void elastic_stretches() {
    double waiting_from = m_.t0;
    double stop = teardown_at_.value_or(m_.t1);
    if (m_.generations.empty()) {
      job_.bars.push_back({waiting_from, stop, "waiting for hosts",
                           "waiting for enough hosts (--min-np)", "#d9d2e9", "waiting"});
      return;
    }
    job_.bars.push_back({waiting_from, m_.generations.front().begin, "waiting for hosts",
                         "waiting for enough hosts (--min-np)", "#d9d2e9", "waiting"});
    for (size_t i = 0; i < m_.generations.size(); ++i) {
      auto& g = m_.generations[i];
      double end =
          std::min(i + 1 < m_.generations.size() ? m_.generations[i + 1].begin : stop, stop);
      if (end < g.begin)
        continue;
      double released = g.released ? std::min(*g.released, end) : end;
      if (released > g.begin || !g.released)
        job_.bars.push_back({g.begin, released, fmt::format("barrier {}", g.number),
                             fmt::format("generation {}: waiting for the processes it carries "
                                         "over to vote ({:.1f} ms){}",
                                         g.number, (released - g.begin) * 1000,
                                         g.released ? "" : "; never released"),
                             "#fce5cd", "barrier"});
      if (g.released && end > released)
        job_.bars.push_back({released, end, fmt::format("generation {}", g.number),
                             fmt::format("generation {} running: {} ranks, {:.1f} ms", g.number,
                                         g.size, (end - released) * 1000),
                             "#8fb3de", "running"});
    }
  }
};

model build(const std::vector<nlohmann::json>& events, double now = 0) {
  return builder{}.build(events, now);
}

std::string generation_label(const generation_info& g) {
  return fmt::format("generation {}: {} rank{} on {}", g.number, g.size, g.size == 1 ? "" : "s",
                     fmt::join(g.hosts, ", "));
}

// Round tick spacing for a span in seconds.
double tick_step(double span) {
  double raw = span / 8;
  double p = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-6))));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (raw <= f * p)
      return f * p;
  return 10 * p;
}

std::string tables(const model& m) {
  std::string out = "<h2>Hosts</h2>\n<table class=\"hosts\"><tr><th>host</th><th>endpoint"
                    "</th><th>first ready</th><th>how it ended</th></tr>\n";
  for (auto& h : m.hosts)
    out += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", xml(h.name), xml(h.endpoint),
        h.ready ? seconds(h.first_seen - m.t0) : std::string{"never"}, xml(h.ending));
  out += "</table>\n<h2>Generations</h2>\n<table class=\"generations\"><tr><th>generation"
         "</th><th>ranks</th><th>hosts</th><th>change</th><th>formed</th><th>released</th>"
         "<th>lasted</th></tr>\n";
  for (auto& g : m.generations) {
    std::vector<std::string> change;
    if (!g.added.empty() && g.number > 1)
      change.push_back(fmt::format("added {}", fmt::join(g.added, ", ")));
    if (!g.removed.empty())
      change.push_back(fmt::format("removed {}", fmt::join(g.removed, ", ")));
    if (!g.reason.empty())
      change.push_back(g.reason);
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                       "<td>{}</td></tr>\n",
                       g.number, g.size, xml(fmt::format("{}", fmt::join(g.hosts, ", "))),
                       xml(fmt::format("{}", fmt::join(change, "; "))), seconds(g.begin - m.t0),
                       g.released ? seconds(*g.released - m.t0) : std::string{"never"},
                       seconds(g.end - g.begin));
  }
  out += "</table>\n<h2>Processes</h2>\n<table class=\"processes\"><tr><th>outcome</th>"
         "<th>count</th></tr>\n";
  for (auto o : all_outcomes)
    if (auto it = m.outcomes.find(o); it != m.outcomes.end())
      out += fmt::format("<tr class=\"{}\"><td>{}</td><td>{}</td></tr>\n", style(o).cls,
                         style(o).legend, it->second);
  out += "</table>\n<h2>Exit</h2>\n<p class=\"exit\">";
  if (m.exit_code)
    out += fmt::format("exit {}{}", *m.exit_code,
                       m.cause.empty() ? std::string{} : ": " + xml(m.cause));
  else
    out += "the job has not ended (yet)";
  return out + "</p>\n";
}

const char* marker_color(const std::string& kind) {
  if (kind == "join" || kind == "returned")
    return "#38761d";
  if (kind == "released")
    return "#3d85c6";
  if (kind == "removed")
    return "#999999";
  if (kind == "lost")
    return "#674ea7";
  return "#cc0000"; // failure, blacklisted
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

std::string timeline_html(const std::vector<nlohmann::json>& events, const std::string& title,
                          const timeline_options& opts) {
  auto m = build(events, opts.now);
  const double left = 160, width = 1000, lane_h = 24;
  double span = std::max(m.t1 - m.t0, 1e-6);
  auto x = [&](double t) { return left + (t - m.t0) / span * width; };

  // Marker words in rows above the lanes: each goes to the first row where it does not
  // overlap the previous word.
  std::vector<double> row_end;
  std::vector<size_t> marker_row;
  for (auto& mk : m.markers) {
    double from = x(mk.t) - 2, to = from + 6.5 * static_cast<double>(mk.text.size()) + 8;
    size_t r = 0;
    while (r < row_end.size() && row_end[r] > from)
      ++r;
    if (r == row_end.size())
      row_end.push_back(0);
    row_end[r] = to;
    marker_row.push_back(r);
  }
  const double gen_row = 18;
  double top = gen_row + 16 * static_cast<double>(row_end.size()) + 8;
  double lanes_bottom = top + lane_h * static_cast<double>(m.lanes.size());
  double height = lanes_bottom + 24;
  std::string svg = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
                                "height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n",
                                left + width + 180, height);
  for (auto& g : m.generations) {
    auto label = generation_label(g);
    double w = std::max(x(g.end) - x(g.begin), 1.0);
    svg += fmt::format("<g class=\"generation\"><rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" "
                       "height=\"{:.1f}\" fill=\"{}\" stroke=\"#cccccc\"/>",
                       x(g.begin), 2, w, lanes_bottom - 2, g.number % 2 ? "#f3f3f3" : "#e8eef7");
    // the generation's words, cut to its band
    size_t fits = static_cast<size_t>(std::max(0.0, (w - 6) / 6.5));
    if (fits >= 4)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{}</text>", x(g.begin) + 3, 14,
                         xml(label.size() <= fits ? label : label.substr(0, fits - 1) + "…"));
    svg += fmt::format("<title>{}</title></g>\n", xml(label));
  }
  for (size_t i = 0; i < m.lanes.size(); ++i) {
    double y = top + lane_h * static_cast<double>(i);
    auto& l = m.lanes[i];
    svg += fmt::format("<g class=\"lane\"><text x=\"4\" y=\"{:.1f}\">{}</text>\n", y + 16,
                       xml(l.name));
    for (auto& b : l.bars) {
      double w = std::max(x(b.end) - x(b.begin), 2.0);
      svg += fmt::format("<g class=\"bar {}\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                         "height=\"{}\" fill=\"{}\" stroke=\"#ffffff\"/>",
                         b.cls, x(b.begin), y + 3, w, lane_h - 6, b.color);
      if (!b.label.empty() && w > 7.0 * static_cast<double>(b.label.size()))
        svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>", x(b.begin) + 3, y + 16,
                           xml(b.label));
      svg += fmt::format("<title>{}</title></g>\n", xml(b.detail.empty() ? b.label : b.detail));
    }
    svg += "</g>\n";
  }
  for (size_t i = 0; i < m.markers.size(); ++i) {
    auto& mk = m.markers[i];
    double y = gen_row + 16 * static_cast<double>(marker_row[i]) + 12;
    svg += fmt::format("<g class=\"marker {0}\"><line x1=\"{1:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" "
                       "y2=\"{3:.1f}\" stroke=\"{4}\" stroke-width=\"1.5\"/><text x=\"{5:.1f}\" "
                       "y=\"{6:.1f}\" fill=\"{4}\">{7}</text><title>{8}</title></g>\n",
                       mk.kind, x(mk.t), y + 2, lanes_bottom, marker_color(mk.kind), x(mk.t) + 2, y,
                       xml(mk.text), xml(mk.detail.empty() ? mk.text : mk.text + ": " + mk.detail));
  }
  double step = tick_step(span);
  for (double s = 0; s <= span + 1e-9; s += step)
    svg += fmt::format("<g class=\"tick\"><line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" "
                       "y2=\"{2:.1f}\" stroke=\"#888888\"/><text x=\"{0:.1f}\" y=\"{3:.1f}\" "
                       "text-anchor=\"middle\">{4}</text></g>\n",
                       x(m.t0 + s), lanes_bottom, lanes_bottom + 4, lanes_bottom + 17,
                       step < 1 ? fmt::format("{:g} ms", std::round(s * 1000))
                                : fmt::format("{:g} s", s));
  svg += "</svg>\n";

  std::string legend = "<div class=\"legend\"><b>Processes:</b>";
  for (auto o : all_outcomes)
    legend += fmt::format(" <span class=\"key {}\"><i style=\"background:{}\"></i>{}</span>",
                          style(o).cls, style(o).color, style(o).legend);
  legend += " <span class=\"key carried\"><i style=\"background:#6fa8dc\"></i>carried into a "
            "later generation (its rank there is on the next stretch)</span>";
  legend += "<br><b>Hosts:</b> <span class=\"key up\"><i style=\"background:#b6d7a8\"></i>ready"
            "</span>";
  if (m.kind == "elastic")
    legend += "<br><b>Job:</b> <span class=\"key waiting\"><i style=\"background:#d9d2e9\"></i>"
              "waiting for hosts</span> <span class=\"key barrier\"><i style=\"background:"
              "#fce5cd\"></i>barrier (a generation waits for its processes to vote)</span> "
              "<span class=\"key running\"><i style=\"background:#8fb3de\"></i>running</span>";
  else
    legend += "<br><b>Job:</b> <span class=\"key phase\"><i style=\"background:#8fb3de\"></i>"
              "phases: connect, nic, launch, run, teardown</span>";
  legend += "<br><b>Markers:</b> joins and returns in green, releases in blue, losses in "
            "purple, failures and blacklisting in red; hover over anything for details.</div>\n";

  std::string state =
      m.exit_code ? fmt::format("ended: exit {}", *m.exit_code)
                  : (opts.refresh_seconds > 0 ? fmt::format("running (this page reloads every "
                                                            "{} s)",
                                                            opts.refresh_seconds)
                                              : std::string{"the log ends before the job did"});
  return fmt::format(
             "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">{4}<title>{0}</title>"
             "<style>body{{font-family:sans-serif;margin:16px}} table{{border-collapse:collapse;"
             "margin-bottom:12px}} td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left}}"
             " .legend{{margin:8px 0;line-height:1.8}} .key{{margin-right:12px;white-space:nowrap}}"
             " .key i{{display:inline-block;width:14px;height:10px;margin-right:4px;"
             "border:1px solid #888}}</style></head>\n"
             "<body><h1>{0}</h1><p class=\"state\">{1} job, {5}; {2} events over {3:.1f} ms.</p>\n",
             xml(title), xml(m.kind), events.size(), span * 1000,
             opts.refresh_seconds > 0 && !m.exit_code
                 ? fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">", opts.refresh_seconds)
                 : std::string{},
             xml(state))
         + legend + svg + tables(m) + "</body></html>\n";
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
    out.push_back({{"name", "thread_sort_index"},
                   {"ph", "M"},
                   {"pid", 1},
                   {"tid", i},
                   {"args", {{"sort_index", i}}}});
    for (auto& b : m.lanes[i].bars)
      out.push_back({{"name", b.label.empty() ? m.lanes[i].name : b.label},
                     {"cat", b.cls},
                     {"ph", "X"},
                     {"pid", 1},
                     {"tid", i},
                     {"ts", us(b.begin)},
                     {"dur", std::max(us(b.end) - us(b.begin), 1.0)},
                     {"args", {{"detail", b.detail}, {"outcome", b.cls}}}});
  }
  out.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 2}, {"args", {{"name", "generations"}}}});
  for (auto& g : m.generations)
    out.push_back({{"name", generation_label(g)},
                   {"ph", "X"},
                   {"pid", 2},
                   {"tid", 0},
                   {"ts", us(g.begin)},
                   {"dur", std::max(us(g.end) - us(g.begin), 1.0)},
                   {"args",
                    {{"released_ms",
                      g.released ? nlohmann::json((*g.released - m.t0) * 1000) : nlohmann::json()},
                     {"added", g.added},
                     {"removed", g.removed}}}});
  for (auto& mk : m.markers)
    out.push_back({{"name", mk.text},
                   {"cat", mk.kind},
                   {"ph", "i"},
                   {"s", "g"},
                   {"pid", 1},
                   {"tid", 0},
                   {"ts", us(mk.t)},
                   {"args", {{"detail", mk.detail}}}});
  return {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
}

} // namespace cafhvd
