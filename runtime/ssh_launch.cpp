// Agents over ssh (see ssh_launch.hpp).
#include "runtime/ssh_launch.hpp"

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

#include "runtime/env.hpp"
#include "runtime/process.hpp"

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
  std::vector<std::string> args{o.agent_path, "node", "--port", "0", "--name", h.name,
                                "--bind", h.bind, "--exit-on-stdin-eof"};
  if (o.cluster_dir.empty()) {
    args.push_back("--insecure");
  } else {
    args.push_back("--cluster-dir");
    args.push_back(o.cluster_dir);
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

struct ssh_agents::session {
  std::mutex m;
  std::condition_variable cv;
  uint16_t port = 0;
  bool ended = false;
  std::vector<std::string> stderr_tail; // ssh's (and the agent's) last words
  exit_status how;
  int stdin_write = -1; // held open: the session lasts while this does
  std::unique_ptr<child_process> child;
  ~session() {
    if (stdin_write >= 0)
      ::close(stdin_write);
  }
};

ssh_agents::ssh_agents(const ssh_options& o, const std::vector<ssh_host>& hosts,
                       std::vector<ssh_result>& results) {
  results.assign(hosts.size(), {});
  auto deadline = std::chrono::steady_clock::now() + o.timeout;
  size_t next = 0;
  auto base_env = forwardable_environment(environ);
  auto start = [&](size_t i) {
    auto s = std::make_shared<session>();
    sessions_.push_back(s);
    int in[2];
    if (::pipe2(in, O_CLOEXEC) != 0) {
      results[i].error = fmt::format("pipe: {}", std::strerror(errno));
      s->ended = true;
      return;
    }
    s->stdin_write = in[1];
    process_spec ps;
    ps.shim = o.shim;
    ps.argv = {o.ssh, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"};
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
    ps.stdin_fd = in[0];
    try {
      s->child = std::make_unique<child_process>(
          ps,
          [s](stream_kind k, std::vector<std::string>&& lines) {
            std::lock_guard g{s->m};
            for (auto& l : lines) {
              if (k == stream_kind::out && s->port == 0)
                s->port = parse_listening_port(l);
              if (k == stream_kind::err) {
                s->stderr_tail.push_back(l);
                if (s->stderr_tail.size() > 5)
                  s->stderr_tail.erase(s->stderr_tail.begin());
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
      results[i].error = fmt::format("cannot run {}: {}", o.ssh, e.what());
      s->ended = true;
    }
    ::close(in[0]);
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
      bool settled = s->port != 0 || s->ended || !results[*it].error.empty();
      if (!settled && std::chrono::steady_clock::now() >= deadline) {
        results[*it].error = fmt::format("no agent port within {} s", o.timeout.count() / 1000.0);
        settled = true;
      }
      if (settled) {
        if (s->port != 0) {
          results[*it].port = s->port;
        } else if (results[*it].error.empty()) {
          std::string said;
          for (auto& l : s->stderr_tail)
            said += (said.empty() ? "" : " / ") + l;
          results[*it].error = fmt::format("{} ended with {} before its agent listened{}", o.ssh,
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
  for (auto& s : sessions_) {
    std::lock_guard g{s->m};
    if (s->stdin_write >= 0) {
      ::close(s->stdin_write);
      s->stdin_write = -1;
    }
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& s : sessions_) {
    std::unique_lock g{s->m};
    s->cv.wait_until(g, until, [&] { return s->ended; });
  }
  sessions_.clear(); // child_process destructors kill what is left
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

struct srun_agents::state {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, uint16_t> ports;
  std::vector<std::string> tail; // srun's last words
  bool ended = false;
  exit_status how;
  int stdin_write = -1;
  std::unique_ptr<child_process> child;
  ~state() {
    if (stdin_write >= 0)
      ::close(stdin_write);
  }
};

srun_agents::srun_agents(const ssh_options& o, const std::vector<std::string>& names,
                         std::vector<uint16_t>& ports, std::string& error)
    : st_(std::make_shared<state>()) {
  ports.assign(names.size(), 0);
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) {
    error = fmt::format("pipe: {}", std::strerror(errno));
    return;
  }
  st_->stdin_write = in[1];
  std::string nodelist;
  for (auto& n : names)
    nodelist += (nodelist.empty() ? "" : ",") + n;
  process_spec ps;
  ps.shim = o.shim;
  ps.argv = {o.ssh, // the srun to run
             fmt::format("--nodes={}", names.size()), fmt::format("--ntasks={}", names.size()),
             "--ntasks-per-node=1", "--overlap", "--input=all", "--label",
             "--nodelist=" + nodelist, "--job-name=caf-hvd-agents", o.agent_path, "node",
             "--port", "0", "--exit-on-stdin-eof"};
  if (o.cluster_dir.empty()) {
    ps.argv.push_back("--insecure");
  } else {
    ps.argv.push_back("--cluster-dir");
    ps.argv.push_back(o.cluster_dir);
  }
  ps.env = forwardable_environment(environ);
  ps.stdin_fd = in[0];
  auto st = st_;
  try {
    st->child = std::make_unique<child_process>(
        ps,
        [st](stream_kind k, std::vector<std::string>&& lines) {
          std::lock_guard g{st->m};
          for (auto& l : lines) {
            auto [name, port] = parse_step_line(l);
            if (port != 0)
              st->ports[name] = port;
            else if (k == stream_kind::err || !l.empty()) {
              st->tail.push_back(l);
              if (st->tail.size() > 5)
                st->tail.erase(st->tail.begin());
            }
          }
          st->cv.notify_all();
        },
        [st](const exit_status& es) {
          std::lock_guard g{st->m};
          st->ended = true;
          st->how = es;
          st->cv.notify_all();
        });
  } catch (const std::exception& e) {
    ::close(in[0]);
    error = fmt::format("cannot run {}: {}", o.ssh, e.what());
    return;
  }
  ::close(in[0]);
  std::unique_lock g{st->m};
  st->cv.wait_for(g, o.timeout, [&] { return st->ended || st->ports.size() >= names.size(); });
  std::vector<std::string> missing;
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = st->ports.find(names[i]);
    if (it != st->ports.end())
      ports[i] = it->second;
    else
      missing.push_back(names[i]);
  }
  if (!missing.empty()) {
    std::string said;
    for (auto& l : st->tail)
      said += (said.empty() ? "" : " / ") + l;
    error = fmt::format("no agent port from node{} {} ({}){}", missing.size() == 1 ? "" : "s",
                        fmt::join(missing, ", "),
                        st->ended ? fmt::format("{} ended with {}", o.ssh, st->how.describe())
                                  : fmt::format("waited {} s", o.timeout.count() / 1000.0),
                        said.empty() ? "" : ": " + said);
  }
}

srun_agents::~srun_agents() {
  {
    std::lock_guard g{st_->m};
    if (st_->stdin_write >= 0) {
      ::close(st_->stdin_write);
      st_->stdin_write = -1;
    }
  }
  std::unique_lock g{st_->m};
  st_->cv.wait_for(g, std::chrono::seconds(10), [&] { return st_->ended; });
  g.unlock();
  st_->child.reset(); // kills srun if it is still there (the step ends with it)
}

} // namespace cafhvd
