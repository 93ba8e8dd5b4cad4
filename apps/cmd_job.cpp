// Starts what a job_request asks for: node agents for the job (--launcher ssh or slurm,
// through runtime/launch/ssh_launch), the live view, the actor system with the driver (and, for
// `caf-hvd run`, the node inside this process); then waits for the job's exit code.
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/driver_util.hpp"
#include "actors/senders.hpp"
#include "apps/job_options.hpp"
#include "runtime/observe/dashboard.hpp"
#include "runtime/observe/line_budget.hpp"
#include "runtime/network/net.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/network/nic_probe.hpp"

namespace cafhvd::cli {

namespace {

// The hosts that get ranks, as the launchers see them.
std::vector<launch_target> launch_targets(const job_config& job) {
  std::vector<launch_target> targets;
  for (size_t i = 0; i < job.addresses.size(); ++i)
    targets.push_back({job.hosts[i].host, job.addresses[i], job.hosts[i].port});
  return targets;
}

// The agents' ports, as the launcher found them.
void take_ports(const std::vector<launch_target>& targets, job_config& job) {
  for (size_t i = 0; i < targets.size(); ++i)
    job.hosts[i].port = targets[i].port;
}

// Every node agent must accept TCP before CAF connects (see check_tcp_reachable); false
// after naming every one that does not.
bool every_agent_reachable(const job_config& job) {
  std::vector<std::pair<std::string, uint16_t>> endpoints;
  for (size_t i = 0; i < job.addresses.size(); ++i)
    endpoints.emplace_back(job.addresses[i], job.hosts[i].port);
  auto problems = check_tcp_reachable(endpoints, job.start_timeout);
  std::string report;
  for (size_t i = 0; i < problems.size(); ++i)
    if (!problems[i].empty())
      report += fmt::format("\n  node agent {}{}: {}", job.hosts[i].endpoint(),
                            job.addresses[i] == job.hosts[i].host
                                ? std::string{}
                                : fmt::format(" ({})", job.addresses[i]),
                            problems[i] == std::strerror(ECONNREFUSED)
                                ? problems[i] + " (is `caf-hvd node` running there?)"
                                : problems[i]);
  if (!report.empty()) {
    std::cerr << "caf-hvd: error: cannot reach every node agent:" << report << "\n";
    return false;
  }
  return true;
}

long unix_s() {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count());
}

// driver --cluster: asks the cluster's table for the job's slots (again every second while
// it waits, up to --slot-wait) and makes the answer the job's host list. "" or why not.
// `self` must live as long as the job: the table frees what it holds for the job when
// this actor is gone (also when the driver is killed).
std::string place_on_cluster(caf::scoped_actor& self, caf::actor_system& sys,
                             const job_request& r,
                             const std::optional<cluster_credentials>& creds, job_config& job) {
  auto& where = *r.cluster;
  auto peer = fmt::format("{}:{}", where.host, where.port);
  std::string error;
  auto table_address = resolve_ipv4(where.host, &error);
  if (!table_address)
    return fmt::format("cannot resolve '{}': {}", where.host, error);
  auto wait = std::chrono::milliseconds(static_cast<long>(r.slot_wait * 1000));
  auto deadline = std::chrono::steady_clock::now() + wait;
  cluster_actor table;
  caf::node_id nid;
  // The table's node when it went away: the middleman may still hand out its cached
  // connection to that node for a moment (the joiner guards the same way).
  caf::node_id gone_nid;
  bool no_table = false; // an agent answered, without a cluster table
  auto connect = [&]() -> std::string {
    std::string why;
    self->request(net::module().connector(sys, creds.has_value()), std::chrono::seconds(10),
                  caf::connect_atom::value, where.host, where.port)
        .receive(
            [&](caf::node_id& n, caf::strong_actor_ptr& published, std::set<std::string>&) {
              if (gone_nid && n == gone_nid) {
                why = fmt::format("the agent at {} is the one that went away (not gone yet)",
                                  peer);
                return;
              }
              nid = n;
              table = caf::actor_cast<cluster_actor>(published);
              if (!table) {
                no_table = true;
                why = fmt::format("{} is a caf-hvd node agent without a cluster table", peer);
              }
            },
            [&](caf::error& e) {
              why = fmt::format("cannot reach the cluster at {}: {}", peer,
                                connect_error(sys, e, creds.has_value(), peer));
            });
    if (why.empty())
      self->monitor(table); // its link breaking is seen at the next ask, not after a timeout
    return why;
  };
  if (auto why = connect(); !why.empty()) {
    // Its agent may be restarting (an upgrade's step): the job waits for it as it would
    // for slots, saying so, unless it is not a table at all.
    auto restarting = [&] {
      return !no_table && why.find("connection refused or host unreachable") != std::string::npos;
    };
    if (!restarting() || wait.count() == 0)
      return why;
    std::cerr << fmt::format("caf-hvd: {}; trying again until --slot-wait ({} s) ends\n", why,
                             r.slot_wait);
    while (!(why = connect()).empty()) {
      if (!restarting())
        return why;
      if (std::chrono::steady_clock::now() >= deadline)
        return fmt::format("{} (tried for --slot-wait {} s)", why, r.slot_wait);
      auto set = termination_signals();
      timespec ts{0, 500 * 1000 * 1000};
      if (int sig = sigtimedwait(&set, nullptr, &ts); sig > 0)
        return fmt::format("{} while waiting for the cluster at {}", strsignal(sig), peer);
    }
    std::cerr << fmt::format("caf-hvd: the cluster at {} answers\n", peer);
  }
  // Whether the table's link broke since the last ask (CAF fails no request to a node that
  // is gone before the request's timeout; its proxy's down message comes at once).
  auto table_gone = [&] {
    bool gone = false, more = true;
    while (more)
      self->receive(
          [&](caf::down_msg& dm) {
            if (dm.source == table.address())
              gone = true;
          },
          caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
    return gone;
  };
  std::string said;
  while (true) {
    signed_ticket ticket;
    if (creds)
      ticket = net::module().sign_ticket(*creds,
                                         ticket_body("place", to_string(nid), r.place.job, unix_s()));
    placement p;
    std::string lost; // the table did not answer: its agent restarts, or its link broke
    bool broke = table_gone();
    if (broke)
      lost = fmt::format("the cluster's table at {} went away (its link broke)", peer);
    auto asked = std::chrono::steady_clock::now();
    // (the table answers in milliseconds; a request to a node that died is only ever
    // failed by its timeout)
    if (lost.empty())
      self->request(table, std::chrono::seconds(5), place_atom::value, r.place, ticket)
          .receive([&](placement& got) { p = std::move(got); },
                   [&](caf::error& e) {
                     lost = fmt::format("the cluster at {} did not answer: {}", peer,
                                        sys.render(e));
                   });
    if (!lost.empty()) {
      // While the job may still wait for slots, a table that went away (its agent
      // restarting, as in an upgrade) is asked again once it is back: the job loses its
      // place in line, not its run.
      if (said.empty() || std::chrono::steady_clock::now() >= deadline)
        return fmt::format("cannot place the job on the cluster at {}: {}", peer, lost);
      std::cerr << fmt::format("caf-hvd: {}; asking it again until --slot-wait ends\n", lost);
      if (broke) // (one that did not answer in time may answer again: asked again as it is)
        gone_nid = nid;
      std::string why;
      while (true) {
        auto set = termination_signals();
        timespec ts{0, 500 * 1000 * 1000};
        if (int sig = sigtimedwait(&set, nullptr, &ts); sig > 0)
          return fmt::format("{} while waiting for slots", strsignal(sig));
        if (why = connect(); why.empty())
          break;
        if (std::chrono::steady_clock::now() >= deadline)
          return fmt::format("no slots on the cluster at {} within --slot-wait {} s: {}", peer,
                             r.slot_wait, why);
      }
      std::cerr << fmt::format("caf-hvd: the cluster at {} answers again\n", peer);
      said = "(asked again)";
      continue;
    }
    if (!p.error.empty())
      return fmt::format("cannot place the job on the cluster at {}: {}", peer, p.error);
    if (!p.waiting) {
      std::vector<std::string> parts;
      for (auto& h : p.hosts) {
        auto address = h.reach(*table_address);
        job.hosts.push_back(host_spec{address, h.port, h.slots});
        job.addresses.push_back(address);
        parts.push_back(fmt::format("{} ({}:{}) {}", h.name, address, h.port, h.slots));
      }
      if (job.verbose || !said.empty())
        std::cerr << fmt::format(
            "caf-hvd: placed on {} (the table answered in {:.1f} ms)\n", fmt::join(parts, ", "),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - asked)
                .count());
      return {};
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return fmt::format("no slots on the cluster at {} within --slot-wait {} s: waited for {}",
                         peer, r.slot_wait, p.waiting_for);
    if (p.waiting_for != said) {
      std::cerr << fmt::format("caf-hvd: waiting for {}\n", p.waiting_for);
      said = p.waiting_for;
    }
    // Asks again in a second (the table keeps its place in line meanwhile); a signal ends
    // the wait.
    auto set = termination_signals();
    timespec ts{1, 0};
    if (int sig = sigtimedwait(&set, nullptr, &ts); sig > 0)
      return fmt::format("{} while waiting for slots", strsignal(sig));
  }
}

// Runs the job; returns its exit code.
int start_job(job_request r) {
  auto& job = r.job;
  std::optional<cluster_credentials> creds;
  if (!job.embedded) {
    creds = credentials_for(r.tls, cert_role::driver);
    job.tls = creds.has_value();
    job.creds = creds;
  }
  std::unique_ptr<srun_agents> step;
  if (r.launcher.kind == "slurm") {
    block_termination_signals(); // before the step's reader thread exists (see below)
    auto so = launcher_options(r.launcher, creds ? creds->dir : std::string{}, shim_path(),
                               job.start_timeout);
    auto targets = launch_targets(job);
    if (auto error = start_agents_over_srun(so, targets, step); !error.empty()) {
      std::cerr << fmt::format("caf-hvd: error: cannot start node agents with {}: {}\n",
                               r.launcher.srun_command, error);
      step.reset();
      return 1;
    }
    take_ports(targets, job);
  }
  std::unique_ptr<ssh_agents> agents;
  if (r.launcher.kind == "ssh") {
    // before the sessions' reader threads exist: they inherit the mask, and a SIGINT
    // that one of them took would end the driver without stopping anything
    block_termination_signals();
    auto so = launcher_options(r.launcher, creds ? creds->dir : std::string{}, shim_path(),
                               job.start_timeout);
    auto targets = launch_targets(job);
    if (auto report = start_agents_over_ssh(so, targets, agents); !report.empty()) {
      std::cerr << "caf-hvd: error: cannot start node agents over ssh:" << report << "\n";
      agents.reset();
      return 1;
    }
    take_ports(targets, job);
  }
  if (!job.embedded && !r.elastic && !every_agent_reachable(job))
    return 1;

  // The live view listens before anything starts, so a port in use fails the job early;
  // its thread starts with the termination signals blocked (they go to the signal
  // thread below, never to a thread that would die of them).
  block_termination_signals();
  std::unique_ptr<dashboard> live;
  if (!r.dashboard.empty()) {
    auto [addr, port] = parse_dashboard_address(r.dashboard);
    try {
      dashboard_options d{addr, port, fmt::format("caf-hvd job: {}", fmt::join(job.command, " ")),
                          2, r.dashboard_names};
      live = std::make_unique<dashboard>(std::move(d));
    } catch (const std::exception& e) {
      std::cerr << fmt::format("caf-hvd: error: --dashboard {}: {}\n", r.dashboard, e.what());
      return 1;
    }
    if (!dashboard_is_loopback(addr))
      std::cerr << fmt::format(
          "caf-hvd: WARNING: the dashboard on {}:{} is plain HTTP without authentication: "
          "anyone who can reach that address sees this job's hosts, command and events\n",
          addr, live->port());
    std::cerr << fmt::format("caf-hvd: dashboard at http://{}:{}/\n",
                             addr.find(':') != std::string::npos ? "[" + addr + "]" : addr,
                             live->port());
    job.event_observer = [d = live.get()](const nlohmann::json& e) { d->add(e); };
  }

  block_termination_signals();
  hvd_config cfg;
  if (job.embedded) {
    cfg.node->name = this_hostname();
    cfg.node->shim = shim_path();
    if (r.local_gpus) {
      cfg.node->gpus = std::make_shared<gpu_pool>(r.local_gpus->devices);
      cfg.node->gpu_source = r.local_gpus->source;
    }
  } else {
    cfg.enable_network(liveness::from_seconds(r.link_timeout), creds ? &*creds : nullptr);
    // the wire guard admits the job's largest message: an executor frame and its call
    net::module().set_wire_cap(job.max_frame + (uint64_t{1} << 20));
  }
  caf::actor_system sys{cfg};
  if (job.embedded)
    cfg.node->guardian = spawn_guardian(sys);
  std::optional<caf::scoped_actor> placer;
  if (r.cluster)
    if (auto why = place_on_cluster(placer.emplace(sys), sys, r, creds, job); !why.empty()) {
      std::cerr << fmt::format("caf-hvd: error: {}\n", why);
      exit_watchdog(1);
      return 1;
    }
  auto result = std::make_shared<job_result>();
  bool networked = !job.embedded;
  auto driver = spawn_driver(sys, std::move(job), result);
  // Peers this process refused (the wire guard's closed connections, the actors' refused
  // messages) go to the job's event log, at most 20 a minute, each with its peer's count.
  {
    auto events = std::make_shared<line_budget>();
    auto tell = [job_actor = caf::actor_cast<caf::actor>(driver), events](
                    const char* layer, const std::string& peer, const std::string& address,
                    const std::string& what, uint64_t count) {
      uint64_t left_out = 0;
      if (!events->take(left_out))
        return;
      nlohmann::json context{{"layer", layer}, {"peer", peer}, {"what", what}, {"count", count}};
      if (!address.empty())
        context["address"] = address;
      if (left_out)
        context["not_recorded_before"] = left_out;
      post_from(job_actor, event_atom::value, std::string{"peer.refused"}, context.dump());
    };
    on_refused_message([tell](const std::string& peer, const std::string& what, uint64_t count) {
      if (peer != "this process")
        tell("message", peer, {}, what, count);
    });
    if (networked)
      net::module().on_wire_refusal([tell](const std::string& who, const std::string& address,
                                           const std::string& why, uint64_t count) {
        tell("wire", who, address, why, count);
      });
  }
  // The signal thread forwards SIGINT/SIGTERM/SIGHUP to the driver; SIGUSR2 (blocked
  // like the others) wakes it when the job is over.
  std::thread signals{[driver] {
    auto set = termination_signals();
    sigaddset(&set, SIGUSR2);
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0)
        continue;
      if (sig == SIGUSR2)
        return;
      post_from(driver, interrupt_atom::value, static_cast<int32_t>(sig));
    }
  }};
  {
    caf::scoped_actor self{sys};
    self->monitor(driver);
    self->receive([](caf::down_msg&) {});
  }
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
  on_refused_message({});
  if (networked)
    net::module().on_wire_refusal({});
  flush_output(); // every line the ranks wrote, however slowly stdout drains
  if (live && r.dashboard_keep > 0) {
    std::cerr << fmt::format("caf-hvd: the dashboard keeps the final page for {} s (Ctrl-C "
                             "ends it sooner)\n",
                             r.dashboard_keep);
    auto set = termination_signals();
    timespec ts{static_cast<time_t>(r.dashboard_keep),
                static_cast<long>((r.dashboard_keep - std::floor(r.dashboard_keep)) * 1e9)};
    sigtimedwait(&set, nullptr, &ts);
  }
  agents.reset(); // agents started for this job end with their ssh sessions
  step.reset();   // ... or with their srun step
  exit_watchdog(result->exit_code);
  if (cfg.node->guardian)
    post_from(cfg.node->guardian, shutdown_atom::value);
  return result->exit_code;
}

} // namespace

int run_job(int argc, char** argv, bool embedded) {
  auto request = parse_job_options(argc, argv, embedded);
  if (!request)
    return 0;
  return start_job(std::move(*request));
}

} // namespace cafhvd::cli
