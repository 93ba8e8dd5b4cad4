// Agents over ssh (see ssh_launch.hpp).
#include "runtime/launch/ssh_launch.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <thread>
#include <unistd.h>

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/job/env.hpp"
#include "runtime/network/nic_probe.hpp"
#include "runtime/launch/process.hpp"

extern char** environ;

namespace cafhvd {

std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789@%+=:,./-_")
                          == std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string agent_command(const ssh_options& o, const ssh_host& h) {
  // An agent for one job, started by its user: ranks run as that user (--rank-user agent)
  std::vector<std::string> args{o.agent_path, "node", "--port", "0", "--name", h.name,
                                "--bind", h.bind, "--exit-on-stdin-eof", "--rank-user", "agent"};
  if (o.cluster_dir.empty()) {
    args.push_back("--insecure");
  } else {
    args.push_back("--cluster-dir");
    args.push_back(o.cluster_dir);
  }
  if (o.link_timeout > 0) {
    args.push_back("--link-timeout");
    args.push_back(fmt::format("{}", o.link_timeout));
  }
  std::string line;
  for (auto& a : args)
    line += (line.empty() ? "" : " ") + shell_quote(a);
  return line;
}

uint16_t parse_listening_port(const std::string& line) {
  auto at = line.find(" listening on ");
  if (line.rfind("caf-hvd node ", 0) != 0 || at == std::string::npos)
    return 0;
  auto rest = line.substr(at + 14);
  auto space = rest.find(' ');
  auto endpoint = rest.substr(0, space);
  auto colon = endpoint.rfind(':');
  if (colon == std::string::npos)
    return 0;
  try {
    auto port = std::stoi(endpoint.substr(colon + 1));
    return port > 0 && port < 65536 ? static_cast<uint16_t>(port) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

std::pair<std::string, uint16_t> parse_step_line(const std::string& line) {
  auto at = line.find("caf-hvd node '");
  if (at == std::string::npos)
    return {"", 0};
  auto rest = line.substr(at);
  auto name_end = rest.find('\'', 14);
  if (name_end == std::string::npos)
    return {"", 0};
  return {rest.substr(14, name_end - 14), parse_listening_port(rest)};
}

// Runs the launcher with a pipe for stdin (held open: the agents live while it is) and
// collects the agent ports its output announces, by agent name.
struct agent_session {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, uint16_t> ports;
  std::vector<std::string> tail; // the launcher's (and the agents') last other words
  bool ended = false;
  exit_status how;
  int stdin_write = -1;
  std::unique_ptr<child_process> child;

  ~agent_session() {
    if (stdin_write >= 0)
      ::close(stdin_write);
  }

  /// Starts `ps` (its stdin becomes the pipe); "" or why it could not start.
  static std::string start(const std::shared_ptr<agent_session>& s, process_spec ps) {
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0) {
      s->ended = true;
      return fmt::format("pipe: {}", std::strerror(errno));
    }
    s->stdin_write = in[1];
    ps.stdin_fd = in[0];
    std::string error;
    try {
      s->child = std::make_unique<child_process>(
          ps,
          [s](stream_kind, std::vector<std::string>&& lines) {
            std::lock_guard g{s->m};
            for (auto& l : lines) {
              if (auto [name, port] = parse_step_line(l); port != 0) {
                s->ports[name] = port;
              } else if (!l.empty()) {
                s->tail.push_back(l);
                if (s->tail.size() > 5)
                  s->tail.erase(s->tail.begin());
              }
            }
            s->cv.notify_all();
          },
          [s](const exit_status& st) {
            std::lock_guard g{s->m};
            s->ended = true;
            s->how = st;
            s->cv.notify_all();
          });
    } catch (const std::exception& e) {
      s->ended = true;
      error = fmt::format("cannot run {}: {}", ps.argv.front(), e.what());
    }
    ::close(in[0]);
    return error;
  }

  /// The tail joined for a message (" / " between lines); call with `m` held.
  std::string last_words() const {
    std::string said;
    for (auto& l : tail)
      said += (said.empty() ? "" : " / ") + l;
    return said;
  }

  /// Closes stdin (the agents stop and exit); waits for the launcher until `until`.
  void end(std::chrono::steady_clock::time_point until) {
    std::unique_lock g{m};
    if (stdin_write >= 0) {
      ::close(stdin_write);
      stdin_write = -1;
    }
    cv.wait_until(g, until, [&] { return ended; });
  }
};

ssh_agents::ssh_agents(const ssh_options& o, const std::vector<ssh_host>& hosts,
                       std::vector<ssh_result>& results) {
  results.assign(hosts.size(), {});
  auto deadline = std::chrono::steady_clock::now() + o.timeout;
  size_t next = 0;
  auto base_env = forwardable_environment(environ);
  auto start = [&](size_t i) {
    auto s = std::make_shared<agent_session>();
    sessions_.push_back(s);
    process_spec ps;
    ps.shim = o.shim;
    ps.argv = {o.client, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"};
    if (o.port > 0) {
      ps.argv.push_back("-p");
      ps.argv.push_back(std::to_string(o.port));
    }
    if (!o.identity.empty()) {
      ps.argv.push_back("-i");
      ps.argv.push_back(o.identity);
    }
    for (auto& x : o.extra) {
      ps.argv.push_back("-o");
      ps.argv.push_back(x);
    }
    ps.argv.push_back(hosts[i].host);
    ps.argv.push_back(agent_command(o, hosts[i]));
    ps.env = base_env;
    results[i].error = agent_session::start(s, std::move(ps));
  };
  // Open up to `parallel` sessions, then one more for each that settles.
  std::vector<size_t> open;
  while (next < hosts.size() || !open.empty()) {
    while (next < hosts.size() && open.size() < std::max<size_t>(1, o.parallel)) {
      start(next);
      open.push_back(next++);
    }
    for (auto it = open.begin(); it != open.end();) {
      auto& s = sessions_[*it];
      std::unique_lock g{s->m};
      bool settled = !s->ports.empty() || s->ended || !results[*it].error.empty();
      if (!settled && std::chrono::steady_clock::now() >= deadline) {
        results[*it].error = fmt::format("no agent port within {} s", o.timeout.count() / 1000.0);
        settled = true;
      }
      if (settled) {
        if (!s->ports.empty()) {
          results[*it].port = s->ports.begin()->second;
        } else if (results[*it].error.empty()) {
          auto said = s->last_words();
          results[*it].error =
              fmt::format("{} ended with {} before its agent listened{}", o.client,
                          s->how.describe(), said.empty() ? "" : ": " + said);
        }
        it = open.erase(it);
      } else {
        ++it;
      }
    }
    if (!open.empty()) {
      auto& s = sessions_[open.front()];
      std::unique_lock g{s->m};
      s->cv.wait_for(g, std::chrono::milliseconds(20));
    }
  }
}

ssh_agents::~ssh_agents() {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& s : sessions_) // every stdin first, so the agents all stop at once
    s->end(std::chrono::steady_clock::now());
  for (auto& s : sessions_)
    s->end(until);
  sessions_.clear(); // child_process destructors kill what is left
}

srun_agents::srun_agents(const ssh_options& o, const std::vector<std::string>& names,
                         std::vector<uint16_t>& ports, std::string& error)
    : step_(std::make_shared<agent_session>()) {
  ports.assign(names.size(), 0);
  std::string nodelist;
  for (auto& n : names)
    nodelist += (nodelist.empty() ? "" : ",") + n;
  process_spec ps;
  ps.shim = o.shim;
  ps.argv = {o.client,
             fmt::format("--nodes={}", names.size()), fmt::format("--ntasks={}", names.size()),
             "--ntasks-per-node=1", "--overlap", "--input=all", "--label",
             "--nodelist=" + nodelist, "--job-name=caf-hvd-agents", o.agent_path, "node",
             "--port", "0", "--exit-on-stdin-eof", "--rank-user", "agent"};
  if (o.cluster_dir.empty()) {
    ps.argv.push_back("--insecure");
  } else {
    ps.argv.push_back("--cluster-dir");
    ps.argv.push_back(o.cluster_dir);
  }
  if (o.link_timeout > 0) {
    ps.argv.push_back("--link-timeout");
    ps.argv.push_back(fmt::format("{}", o.link_timeout));
  }
  ps.env = forwardable_environment(environ);
  error = agent_session::start(step_, std::move(ps));
  if (!error.empty())
    return;
  auto& st = *step_;
  std::unique_lock g{st.m};
  st.cv.wait_for(g, o.timeout, [&] { return st.ended || st.ports.size() >= names.size(); });
  std::vector<std::string> missing;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = st.ports.find(names[i]);
    if (it != st.ports.end())
      ports[i] = it->second;
    else
      missing.push_back(names[i]);
  }
  if (!missing.empty()) {
    auto said = st.last_words();
    error = fmt::format("no agent port from node{} {} ({}){}", missing.size() == 1 ? "" : "s",
                        fmt::join(missing, ", "),
                        st.ended ? fmt::format("{} ended with {}", o.client, st.how.describe())
                                 : fmt::format("waited {} s", o.timeout.count() / 1000.0),
                        said.empty() ? "" : ": " + said);
  }
}

srun_agents::~srun_agents() {
  step_->end(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  step_->child.reset(); // kills srun if it is still there (the step ends with it)
}

ssh_options launcher_options(const launcher_config& l, const std::string& cluster_dir,
                             const std::string& shim, std::chrono::milliseconds timeout) {
  ssh_options so;
  so.agent_path = l.agent_path.empty() ? executable_dir() + "/caf-hvd" : l.agent_path;
  so.cluster_dir = cluster_dir;
  so.shim = shim;
  so.timeout = timeout;
  so.link_timeout = l.link_timeout;
  if (l.kind == "ssh") {
    so.client = l.ssh_command;
    so.port = l.ssh_port;
    so.identity = l.ssh_identity;
    so.extra = l.ssh_extra;
  } else if (l.kind == "slurm") {
    so.client = l.srun_command;
  }
  return so;
}

std::string start_agents_over_ssh(const ssh_options& o, std::vector<launch_target>& targets,
                                  std::unique_ptr<ssh_agents>& agents) {
  std::vector<std::pair<std::string, uint16_t>> endpoints;
  for (auto& t : targets)
    endpoints.emplace_back(t.address, t.port);
  auto answering = check_tcp_reachable(endpoints, std::chrono::milliseconds(1000));
  std::vector<ssh_host> wanted;
  std::vector<size_t> which;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (answering[i].empty())
      continue; // an agent is there already: reused
    auto& host = targets[i].host;
    auto name = host.substr(host.find('@') == std::string::npos ? 0 : host.find('@') + 1);
    wanted.push_back({host, name, targets[i].address});
    which.push_back(i);
  }
  if (wanted.empty())
    return {};
  std::vector<ssh_result> results;
  agents = std::make_unique<ssh_agents>(o, wanted, results);
  std::string report;
  for (size_t k = 0; k < wanted.size(); ++k) {
    if (results[k].port == 0)
      report += fmt::format("\n  host {}: {}", wanted[k].host, results[k].error);
    else
      targets[which[k]].port = results[k].port;
  }
  return report;
}

std::string start_agents_over_srun(const ssh_options& o, std::vector<launch_target>& targets,
                                   std::unique_ptr<srun_agents>& step) {
  std::vector<std::string> names;
  for (auto& t : targets)
    names.push_back(t.host);
  std::vector<uint16_t> ports;
  std::string error;
  step = std::make_unique<srun_agents>(o, names, ports, error);
  if (!error.empty())
    return error;
  for (size_t i = 0; i < ports.size(); ++i)
    targets[i].port = ports[i];
  return {};
}

} // namespace cafhvd
