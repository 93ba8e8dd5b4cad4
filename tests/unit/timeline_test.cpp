// The timeline drawn from a small event log: lanes, bars, bands, failures, both formats.
#include <doctest/doctest.h>

#include <sstream>

#include "runtime/timeline.hpp"

using namespace cafhvd;
using json = nlohmann::json;

namespace {

std::vector<json> sample() {
  std::istringstream in{R"(
{"timestamp": 100.000, "name": "job.start", "context": {"kind": "elastic"}}
{"timestamp": 100.010, "name": "host.ready", "context": {"host": "a", "address": "10.0.0.1", "interfaces": ["eth0"]}}
{"timestamp": 100.020, "name": "generation.begin", "context": {"generation": 1, "size": 2, "hosts": ["a", "b"]}}
{"timestamp": 100.030, "name": "rank.started", "context": {"rank": 0, "host": "a", "slot": "a:0", "pid": 7}}
{"timestamp": 100.031, "name": "rank.started", "context": {"rank": 1, "host": "b", "slot": "b:0", "pid": 8}}
{"timestamp": 100.500, "name": "rank.ended", "context": {"rank": 1, "host": "b", "slot": "b:0", "code": 137, "signal": 9, "generation": 1}}
{"timestamp": 100.501, "name": "failure", "context": {"cause": "rank 1 on host b ended with signal 9"}}
{"timestamp": 100.502, "name": "host.blacklisted", "context": {"host": "b", "failures": 1}}
{"timestamp": 100.510, "name": "generation.begin", "context": {"generation": 2, "size": 1, "hosts": ["a"]}}
{"timestamp": 101.000, "name": "rank.ended", "context": {"rank": 0, "host": "a", "slot": "a:0", "code": 0, "signal": 0}}
{"timestamp": 101.000, "name": "job.end", "context": {"code": 0}}
)"};
  return read_events(in, "sample");
}

} // namespace

TEST_CASE("timeline page: a lane per host and slot, generation bands, failures on hover") {
  auto html = timeline_html(sample(), "job <1>");
  CHECK(html.find("<title>job &lt;1&gt;</title>") != std::string::npos);
  CHECK(html.find("<svg") != std::string::npos);
  for (auto lane : {">job<", ">host a<", ">host b<", ">slot a:0<", ">slot b:0<"})
    CHECK(html.find(lane) != std::string::npos);
  CHECK(html.find("generation 1 (2 ranks on") != std::string::npos);
  CHECK(html.find("generation 2 (1 ranks on") != std::string::npos);
  CHECK(html.find("failure: rank 1 on host b ended with signal 9") != std::string::npos);
  CHECK(html.find("rank 1 on b (slot b:0), generation 1: code 137 (signal 9)")
        != std::string::npos);
  CHECK(html.find("<script") == std::string::npos); // nothing to run, nothing to fetch
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));
  CHECK(html.find("1000.0 ms") != std::string::npos); // the time axis spans the log
}

TEST_CASE("timeline trace: complete events per lane with durations, instants for failures") {
  auto trace = timeline_trace(sample());
  auto& ev = trace.at("traceEvents");
  std::map<std::string, int> tid_of;
  for (auto& e : ev)
    if (e["ph"] == "M")
      tid_of[e["args"]["name"]] = e["tid"];
  CHECK(tid_of.count("slot a:0"));
  CHECK(tid_of.count("host b"));
  bool rank1 = false, failure = false;
  for (auto& e : ev) {
    if (e["ph"] == "X" && e["tid"] == tid_of["slot b:0"]) {
      rank1 = true;
      CHECK(e["ts"].get<double>() == doctest::Approx(31000).epsilon(0.001));
      CHECK(e["dur"].get<double>() == doctest::Approx(469000).epsilon(0.001));
    }
    if (e["ph"] == "i") {
      failure = true;
      CHECK(e["args"]["cause"] == "rank 1 on host b ended with signal 9");
    }
  }
  CHECK(rank1);
  CHECK(failure);
}

TEST_CASE("timeline input errors name the line") {
  std::istringstream bad{"{\"timestamp\": 1, \"name\": \"x\", \"context\": {}}\n{\"name\": 3}\n"};
  CHECK_THROWS_WITH(read_events(bad, "ev.jsonl"),
                    "ev.jsonl:2: not an event (expected timestamp, name and context)");
  std::istringstream empty{""};
  CHECK_THROWS_WITH(read_events(empty, "ev.jsonl"), "ev.jsonl: no events");
}
