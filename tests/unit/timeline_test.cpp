// The timeline drawn from small event logs: lanes, segments, bands, markers, tables, both
// formats, and the live page.
#include <doctest/doctest.h>

#include <regex>
#include <sstream>

#include "runtime/observe/timeline.hpp"

using namespace cafhvd;
using json = nlohmann::json;

namespace {

std::vector<json> events(const std::string& text) {
  std::istringstream in{text};
  return read_events(in, "sample");
}

// A failure, a blacklisting and a smaller generation.
std::vector<json> sample() {
  return events(R"(
{"timestamp": 100.000, "name": "job.start", "context": {"kind": "elastic"}}
{"timestamp": 100.005, "name": "discovery", "context": {"hosts": ["h1:1", "h2:1"]}}
{"timestamp": 100.010, "name": "host.ready", "context": {"host": "a", "endpoint": "h1:1", "address": "10.0.0.1", "interfaces": ["eth0"]}}
{"timestamp": 100.011, "name": "host.ready", "context": {"host": "b", "endpoint": "h2:1", "address": "10.0.0.2", "interfaces": ["eth0"]}}
{"timestamp": 100.020, "name": "generation.begin", "context": {"generation": 1, "size": 2, "hosts": ["a", "b"], "plan": [{"rank": 0, "host": "a", "local_rank": 0}, {"rank": 1, "host": "b", "local_rank": 0}]}}
{"timestamp": 100.021, "name": "generation.released", "context": {"generation": 1}}
{"timestamp": 100.030, "name": "rank.started", "context": {"rank": 0, "host": "a", "slot": "a:0", "pid": 7, "generation": 1}}
{"timestamp": 100.031, "name": "rank.started", "context": {"rank": 1, "host": "b", "slot": "b:0", "pid": 8, "generation": 1}}
{"timestamp": 100.500, "name": "rank.ended", "context": {"rank": 1, "host": "b", "slot": "b:0", "code": 137, "signal": 9, "generation": 1}}
{"timestamp": 100.501, "name": "failure", "context": {"cause": "rank 1 on host b ended with signal 9"}}
{"timestamp": 100.502, "name": "host.blacklisted", "context": {"host": "b", "failures": 1, "cooldown_seconds": null}}
{"timestamp": 100.510, "name": "generation.begin", "context": {"generation": 2, "size": 1, "hosts": ["a"], "removed": ["b"], "plan": [{"rank": 0, "host": "a", "local_rank": 0}]}}
{"timestamp": 100.600, "name": "generation.released", "context": {"generation": 2}}
{"timestamp": 101.000, "name": "rank.ended", "context": {"rank": 0, "host": "a", "slot": "a:0", "code": 0, "signal": 0, "generation": 2}}
{"timestamp": 101.000, "name": "job.end", "context": {"code": 0, "cause": null}}
)");
}

// Three hosts listed z, y, x; x joins; y's agent is lost while its rank runs.
std::vector<json> join_then_loss(bool ended = true) {
  std::string text = R"(
{"timestamp": 200.000, "name": "job.start", "context": {"kind": "elastic"}}
{"timestamp": 200.001, "name": "discovery", "context": {"hosts": ["z:1", "y:1"]}}
{"timestamp": 200.010, "name": "host.ready", "context": {"host": "z", "endpoint": "z:1"}}
{"timestamp": 200.011, "name": "host.ready", "context": {"host": "y", "endpoint": "y:1"}}
{"timestamp": 200.020, "name": "generation.begin", "context": {"generation": 1, "size": 2, "hosts": ["z", "y"], "plan": [{"rank": 0, "host": "z", "local_rank": 0}, {"rank": 1, "host": "y", "local_rank": 0}]}}
{"timestamp": 200.021, "name": "generation.released", "context": {"generation": 1}}
{"timestamp": 200.030, "name": "rank.started", "context": {"rank": 0, "host": "z", "slot": "z:0", "pid": 1, "generation": 1}}
{"timestamp": 200.031, "name": "rank.started", "context": {"rank": 1, "host": "y", "slot": "y:0", "pid": 2, "generation": 1}}
{"timestamp": 200.300, "name": "discovery", "context": {"hosts": ["z:1", "y:1", "x:1"]}}
{"timestamp": 200.310, "name": "host.ready", "context": {"host": "x", "endpoint": "x:1"}}
{"timestamp": 200.320, "name": "generation.begin", "context": {"generation": 2, "size": 3, "hosts": ["z", "y", "x"], "added": ["x"], "plan": [{"rank": 0, "host": "z", "local_rank": 0}, {"rank": 1, "host": "y", "local_rank": 0}, {"rank": 2, "host": "x", "local_rank": 0}]}}
{"timestamp": 200.400, "name": "generation.released", "context": {"generation": 2}}
{"timestamp": 200.401, "name": "rank.started", "context": {"rank": 2, "host": "x", "slot": "x:0", "pid": 3, "generation": 2}}
{"timestamp": 200.600, "name": "host.lost", "context": {"host": "y", "cause": "connection lost"}}
{"timestamp": 200.601, "name": "generation.begin", "context": {"generation": 3, "size": 2, "hosts": ["z", "x"], "removed": ["y"], "plan": [{"rank": 0, "host": "z", "local_rank": 0}, {"rank": 1, "host": "x", "local_rank": 0}]}}
{"timestamp": 200.700, "name": "generation.released", "context": {"generation": 3}}
)";
  if (ended)
    text += R"(
{"timestamp": 201.000, "name": "rank.ended", "context": {"rank": 0, "host": "z", "slot": "z:0", "code": 0, "signal": 0, "generation": 3}}
{"timestamp": 201.000, "name": "rank.ended", "context": {"rank": 1, "host": "x", "slot": "x:0", "code": 0, "signal": 0, "generation": 3}}
{"timestamp": 201.100, "name": "job.end", "context": {"code": 0, "cause": null}}
)";
  return events(text);
}

// The hover texts of `lane`'s bars, in order.
std::vector<std::string> titles(const std::string& html, const std::string& lane) {
  auto at = html.find("<g class=\"lane\"><text x=\"4\" y=\"");
  while (at != std::string::npos) {
    auto name_at = html.find('>', html.find("<text", at)) + 1;
    auto name = html.substr(name_at, html.find('<', name_at) - name_at);
    auto end = html.find("\n</g>", at);
    if (name == lane) {
      std::vector<std::string> out;
      auto body = html.substr(at, end - at);
      std::regex title{R"re(<g class="bar (\w+)">.*?<title>([^<]*)</title>)re"};
      for (auto it = std::sregex_iterator(body.begin(), body.end(), title);
           it != std::sregex_iterator(); ++it)
        out.push_back((*it)[1].str() + " | " + (*it)[2].str());
      return out;
    }
    at = html.find("<g class=\"lane\"><text x=\"4\" y=\"", end);
  }
  return {};
}

} // namespace

TEST_CASE("timeline page: lanes, plain-text generations, markers with words, a legend") {
  auto html = timeline_html(sample(), "job <1>");
  CHECK(html.find("<title>job &lt;1&gt;</title>") != std::string::npos);
  for (auto lane : {">job<", ">host a<", ">host b<", ">slot a:0<", ">slot b:0<"})
    CHECK(html.find(lane) != std::string::npos);
  CHECK(html.find("<title>generation 1: 2 ranks on a, b</title>") != std::string::npos);
  CHECK(html.find("<title>generation 2: 1 rank on a</title>") != std::string::npos);
  CHECK(html.find("[&quot;") == std::string::npos); // no JSON lists
  CHECK(html.find(">failure</text><title>failure: rank 1 on host b ended with signal 9")
        != std::string::npos);
  CHECK(html.find(">blacklisted b</text>") != std::string::npos);
  CHECK(html.find("class=\"legend\"") != std::string::npos);
  CHECK(html.find("lost with its host (no exit seen)") != std::string::npos);
  CHECK(titles(html, "slot b:0")
        == std::vector<std::string>{"failed | rank 1 on b (slot b:0), generation 1, pid 8: "
                                    "signal 9 (code 137)"});
  // a's process lived through generation 2's release: two segments, rank 0 in both
  CHECK(titles(html, "slot a:0").size() == 2);
  CHECK(html.find("<script") == std::string::npos); // nothing to run, nothing to fetch
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));
  CHECK(html.find("http-equiv=\"refresh\"") == std::string::npos);
  // an elastic job's lane: waiting, then barrier and running per generation
  auto job = titles(html, "job");
  REQUIRE(job.size() == 5);
  CHECK(job[0].rfind("waiting | ", 0) == 0);
  CHECK(job[1].rfind("barrier | generation 1: waiting for the processes", 0) == 0);
  CHECK(job[2].rfind("running | generation 1 running", 0) == 0);
  CHECK(job[3].rfind("barrier | generation 2: waiting for the processes it carries over to "
                     "vote (90.0 ms)",
                     0)
        == 0);
  CHECK(job[4].rfind("running | generation 2 running", 0) == 0);
  // the tables: hosts, generations, outcomes, the exit
  CHECK(html.find("<tr><td>b</td><td>h2:1</td><td>0.01 s</td><td>blacklisted at 0.50 s for "
                  "the rest of the job</td></tr>")
        != std::string::npos);
  CHECK(html.find("<tr><td>2</td><td>1</td><td>a</td><td>removed b</td><td>0.51 s</td>"
                  "<td>0.60 s</td><td>0.49 s</td></tr>")
        != std::string::npos);
  CHECK(html.find("<p class=\"exit\">exit 0</p>") != std::string::npos);
}

TEST_CASE("timeline page: a lost host ends its slots there; each segment has its rank") {
  auto html = timeline_html(join_then_loss(), "t");
  // hosts in the job's order (as discovery listed them), not alphabetical
  auto z = html.find(">host z<"), y = html.find(">host y<"), x = html.find(">host x<");
  CHECK(z < y);
  CHECK(y < x);
  CHECK(html.find(">slot z:0<") < html.find(">slot y:0<"));
  // y's process ends where y was lost, drawn as lost (not as running to the end)
  auto ys = titles(html, "slot y:0");
  REQUIRE(ys.size() == 2);
  CHECK(ys[0].rfind("carried | rank 1 on y (slot y:0), generation 1", 0) == 0);
  CHECK(ys[1].rfind("lost | rank 1 on y (slot y:0), generation 2, pid 2: its host was lost", 0)
        == 0);
  // x's one process: rank 2 in generation 2, rank 1 in generation 3
  auto xs = titles(html, "slot x:0");
  REQUIRE(xs.size() == 2);
  CHECK(xs[0].rfind("carried | rank 2 on x (slot x:0), generation 2", 0) == 0);
  CHECK(xs[1].rfind("ok | rank 1 on x (slot x:0), generation 3, pid 3: exit 0", 0) == 0);
  CHECK(html.find(">join: x</text>") != std::string::npos);
  CHECK(html.find(">lost y</text>") != std::string::npos);
  CHECK(html.find(">generation 3 released</text>") != std::string::npos);
  CHECK(html.find("<td>y</td><td>y:1</td><td>0.01 s</td><td>lost at 0.60 s: connection lost"
                  "</td>")
        != std::string::npos);
  CHECK(html.find("<tr class=\"lost\"><td>lost with its host (no exit seen)</td><td>1</td>")
        != std::string::npos);
}

TEST_CASE("live page: reloads itself while the job runs and runs up to now") {
  auto running = join_then_loss(false);
  timeline_options live;
  live.refresh_seconds = 2;
  live.now = 203.0; // 2.3 s after the last event
  auto html = timeline_html(running, "t", live);
  CHECK(html.find("<meta http-equiv=\"refresh\" content=\"2\">") != std::string::npos);
  CHECK(html.find("running (this page reloads every 2 s)") != std::string::npos);
  CHECK(html.find("over 3000.0 ms") != std::string::npos);
  CHECK(titles(html, "slot z:0").back().rfind("running | ", 0) == 0);
  CHECK(html.find("the job has not ended (yet)") != std::string::npos);
  // once the job has ended, the page stays still
  auto done = timeline_html(join_then_loss(true), "t", live);
  CHECK(done.find("http-equiv=\"refresh\"") == std::string::npos);
  CHECK(done.find("ended: exit 0") != std::string::npos);
}

TEST_CASE("timeline trace: lanes in order, segments named by rank, markers with words") {
  auto trace = timeline_trace(join_then_loss());
  auto& ev = trace.at("traceEvents");
  std::map<std::string, int> tid_of;
  for (auto& e : ev)
    if (e["name"] == "thread_name")
      tid_of[e["args"]["name"]] = e["tid"];
  CHECK(tid_of.at("host z") < tid_of.at("host y"));
  std::vector<std::string> x_segments, markers;
  for (auto& e : ev) {
    if (e["ph"] == "X" && e["pid"] == 1 && e["tid"] == tid_of.at("slot x:0"))
      x_segments.push_back(e["name"]);
    if (e["ph"] == "i")
      markers.push_back(e["name"]);
    if (e["ph"] == "X" && e["pid"] == 1 && e["tid"] == tid_of.at("slot y:0")
        && e["cat"] == "lost")
      CHECK(e["ts"].get<double>() + e["dur"].get<double>()
            == doctest::Approx(600000).epsilon(0.001));
  }
  CHECK(x_segments == std::vector<std::string>{"rank 2", "rank 1"});
  CHECK(std::find(markers.begin(), markers.end(), "lost y") != markers.end());
  CHECK(std::find(markers.begin(), markers.end(), "join: x") != markers.end());
}

TEST_CASE("timeline input errors name the line") {
  std::istringstream bad{"{\"timestamp\": 1, \"name\": \"x\", \"context\": {}}\n{\"name\": 3}\n"};
  CHECK_THROWS_WITH(read_events(bad, "ev.jsonl"),
                    "ev.jsonl:2: not an event (expected timestamp, name and context)");
  std::istringstream empty{""};
  CHECK_THROWS_WITH(read_events(empty, "ev.jsonl"), "ev.jsonl: no events");
}
