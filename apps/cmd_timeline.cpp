// caf-hvd timeline EVENTS -o OUT: draws a job's event log (--events) as a page or a
// trace, through runtime/observe/timeline.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/cli.hpp"
#include "runtime/observe/timeline.hpp"
#include "runtime/observe/text.hpp"

namespace cafhvd::cli {

int run_timeline(int argc, char** argv) {
  po::options_description desc{"caf-hvd timeline: draw a job's event log.\n\n"
                               "usage: caf-hvd timeline EVENTS -o OUT.html|OUT.json\n\noptions"};
  std::string in, out, title;
  desc.add_options()("help,h", "show this help")(
      "output,o", po::value(&out),
      "OUT.html: a self-contained page with SVG lanes; OUT.json: Chrome trace-event JSON "
      "(Perfetto, chrome://tracing)")("title", po::value(&title), "the page's title");
  po::options_description hidden;
  hidden.add_options()("events", po::value(&in), "the event log");
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("events", 1);
  std::vector<std::string> args(argv + 2, argv + argc);
  auto vm = parse(args, all, &pos);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (in.empty() || out.empty())
    throw usage_error("give the event log and -o OUT.html or -o OUT.json");
  bool html = out.size() > 5 && out.substr(out.size() - 5) == ".html";
  bool trace = out.size() > 5 && out.substr(out.size() - 5) == ".json";
  if (!html && !trace)
    throw usage_error(fmt::format("-o {}: name a .html (page) or .json (trace) file", out));
  std::ifstream f{in};
  if (!f)
    throw usage_error(fmt::format("cannot read the event log {}", in));
  auto events = read_events(f, in);
  std::ofstream o{out};
  if (!o)
    throw usage_error(fmt::format("-o {}: cannot write it", out));
  if (html)
    o << timeline_html(events, title.empty() ? "caf-hvd job " + in : title);
  else
    o << json_text(timeline_trace(events)) << "\n";
  if (!o.flush())
    throw std::runtime_error(fmt::format("writing {} failed", out));
  return 0;
}

} // namespace cafhvd::cli
