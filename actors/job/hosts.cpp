// The job actor's host membership: discovery runs, the static host list, reachability
// checks, connects (a window of TLS handshakes), colocators and node info, readiness,
// unusable and lost hosts, the blacklist, and starting the coordinator's servers.
#include "actors/job/job_actor.hpp"
#include "actors/senders.hpp"
#include "runtime/network/net.hpp"
#include "runtime/observe/text.hpp"

namespace cafhvd::driver_impl {

// Where an elastic job's hosts come from, for messages.
std::string job::discovery_name() const {
  return ec_.cluster ? fmt::format("the cluster's table at {}:{}", ec_.cluster->host,
                                   ec_.cluster->port)
                     : fmt::format("host discovery script {}", ec_.discovery_script);
}

// The cluster's live members and the slots this job may use there, as a discovery
// script's lines (the table's own agent at the address the driver reaches the table).
void job::discover_from_cluster() {
  discovering_ = true;
  auto& where = *ec_.cluster;
  auto peer = fmt::format("{}:{}", where.host, where.port);
  auto mm = net::module().connector(system(), job_.tls);
  request(mm, std::chrono::seconds(10), caf::connect_atom::value, where.host, where.port)
      .then(
          [this, peer](caf::node_id& nid, caf::strong_actor_ptr& published,
                       std::set<std::string>&) {
            auto table = caf::actor_cast<cluster_actor>(published);
            if (!table)
              return on_discovered(false, "could not find a cluster table there");
            table_ = table.address();
            signed_ticket ticket;
            if (job_.creds) {
              try {
                ticket = net::module().sign_ticket(
                    *job_.creds,
                    ticket_body("discover", to_string(nid), job_id_,
                                static_cast<long>(
                                    std::chrono::duration_cast<std::chrono::seconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count())));
              } catch (const std::exception& e) {
                return on_discovered(false, fmt::format("could not sign a ticket: {}", e.what()));
              }
            }
            placement_request asked;
            asked.job = job_id_;
            asked.labels = ec_.cluster_labels;
            asked.cpus_per_slot = job_.cpus_per_slot;
            asked.gpus_per_slot = job_.gpus_per_slot;
            // at most this many ranks in all: the table holds no more of its free slots
            asked.np = ec_.max_np ? static_cast<uint32_t>(*ec_.max_np) : 0;
            request(table, std::chrono::seconds(10), discover_atom::value, std::move(asked),
                    std::move(ticket))
                .then(
                    [this](placement& p) {
                      if (!p.error.empty())
                        return on_discovered(false, "could not list its nodes: " + p.error);
                      // a table that has just started (its agent restarted): a job with
                      // hosts keeps them until the members have joined it again
                      if (p.waiting && discovery_runs_ > 0)
                        return on_discovered(false, "could not list its nodes yet: "
                                                        + p.waiting_for);
                      std::string text;
                      for (auto& h : p.hosts)
                        text += fmt::format("{}:{}:{}\n", h.reach(ec_.cluster->host), h.port,
                                            h.slots);
                      on_discovered(true, text);
                    },
                    [this](caf::error& e) {
                      on_discovered(false, "could not list its nodes: " + describe(e));
                    });
          },
          [this, peer](caf::error& e) {
            on_discovered(false, "could not reach it: " + connect_error(e, peer));
          });
}

void job::run_discovery() {
  if (!done_ && !discovering_ && ec_.cluster)
    return discover_from_cluster();
  // Without a script (tests on the test coordinator), discovery results arrive as
  // messages.
  if (done_ || discovering_ || ec_.discovery_script.empty())
    return;
  discovering_ = true;
  auto hdl = caf::actor_cast<job_actor>(this);
  std::thread{[hdl, shim = ec_.shim, path = ec_.discovery_script, timeout = ec_.discovery_timeout] {
    auto r = run_discovery_script(shim, path, timeout);
    post_from(hdl, discover_atom::value, r.ok, r.ok ? r.output : r.error);
  }}.detach();
}

// After a discovery run: the next timer (for the timer's runs, or when the timer fired
// during a nudged run), then a nudge that came meanwhile.
void job::discovery_ended() {
  if (!ec_.cluster || timer_run_ || timer_missed_)
    delayed_send(this, ec_.discovery_interval, discover_atom::value);
  timer_run_ = timer_missed_ = false;
  if (nudged_ && !done_) {
    nudged_ = false;
    run_discovery();
  }
}

void job::on_discovered(bool ok, const std::string& text) {
  discovering_ = false;
  if (done_)
    return;
  bool first = discovery_runs_++ == 0;
  std::vector<host_spec> specs;
  std::string error;
  if (ok) {
    try {
      specs = parse_discovery_output(text, ec_.slots_per_host);
    } catch (const std::exception& e) {
      error = e.what();
    }
  } else {
    error = text.rfind("could not", 0) == 0 ? text : fmt::format("it {}", text);
  }
  if (!error.empty()) {
    // A table that cannot be reached yet (its agent restarting, an upgrade's step) is
    // waited for, up to --start-timeout from the job's start, saying so once.
    if (first && ec_.cluster
        && error.find("connection refused or host unreachable") != std::string::npos
        && clock_type::now() - started_ < job_.start_timeout) {
      discovery_runs_ = 0; // the next call is still the first
      if (!table_wait_said_) {
        table_wait_said_ = true;
        say("waiting for {}: {}; trying again every second for up to {} s (--start-timeout)",
            discovery_name(), error, job_.start_timeout.count() / 1000.0);
      }
      delayed_send(this, std::chrono::seconds(1), discover_atom::value);
      return;
    }
    if (first)
      return fail(fmt::format("{} failed on its first call: {}{}", discovery_name(), error,
                              table_wait_said_ ? " (tried for --start-timeout)" : ""));
    say("warning: {} failed (keeping the last host set, trying again in {} s): {}",
        discovery_name(), ec_.discovery_interval.count() / 1000.0, error);
    return discovery_ended();
  }
  {
    std::vector<std::string> listed;
    for (auto& spec : specs)
      listed.push_back(spec.endpoint());
    if (listed != last_listed_ || first)
      events_.emit("discovery", {{"hosts", listed}});
    last_listed_ = std::move(listed);
  }
  listed_order_.clear();
  for (auto& [ep, h] : hosts_)
    h.listed = false;
  for (auto& spec : specs) {
    auto ep = spec.endpoint();
    listed_order_.push_back(ep);
    if (std::find(ever_listed_.begin(), ever_listed_.end(), ep) == ever_listed_.end())
      ever_listed_.push_back(ep);
    auto it = hosts_.find(ep);
    if (it == hosts_.end()) {
      ehost h;
      h.spec = spec;
      h.listed = true;
      hosts_.emplace(ep, std::move(h));
      connect_host(ep);
      continue;
    }
    auto& h = it->second;
    h.spec.slots = spec.slots;
    h.listed = !h.draining;
    if (h.full_cap >= 0 && clock_type::now() >= h.full_until)
      h.full_cap = -1; // a full node's slots are asked for again
    if (h.st == ehost::status::ready)
      warn_if_capped(h);
    if ((h.st == ehost::status::lost || h.st == ehost::status::unusable) && !h.blacklisted
        && clock_type::now() >= h.retry_at)
      connect_host(ep);
  }
  // Cooldowns that ended: the host may take part again.
  auto now = clock_type::now();
  for (auto& [ep, h] : hosts_) {
    if (h.blacklisted && h.cooldown_end && now >= *h.cooldown_end) {
      h.blacklisted = false;
      h.cooldown_end.reset();
      say("host {} is back from its blacklist cooldown", h.label());
      events_.emit("host.returned", {{"host", h.info.name}});
      if (h.listed && h.st != ehost::status::ready && h.st != ehost::status::connecting)
        connect_host(ep);
    }
  }
  reconsider();
  discovery_ended();
}

// A node of the job drains (its colocator says so: an administrator drained it, or its
// agent got SIGTERM with --drain-grace) or is back. An elastic job leaves it as a host
// gone from discovery: at its next commit, not counted as a failure. A static job's ranks
// run on; the job is told now, so that a stop at the grace is no surprise.
void job::on_drain(const std::string& node, bool on, const std::string& how) {
  auto sender = current_sender();
  for (auto& [ep, h] : hosts_) {
    // only the node's own colocator speaks for it
    if (h.info.name != node || !h.colocator || !sender
        || h.colocator.address() != caf::actor_cast<caf::actor_addr>(sender))
      continue;
    if (h.draining == on)
      return;
    h.draining = on;
    events_.emit("host.draining", {{"host", node}, {"on", on}, {"how", how}});
    size_t ranks = 0;
    for (auto& [id, s] : slots_)
      ranks += s.endpoint == ep && s.running ? 1 : 0;
    if (!elastic_) {
      if (on && ranks > 0)
        say("warning: node {} drains ({}); this job's {} rank{} there run on, and the job fails "
            "if the node stops them",
            printable(node), printable(how), ranks, ranks == 1 ? "" : "s");
      return;
    }
    if (on) {
      say("node {} drains ({}): the job leaves it at its next commit", printable(node),
          printable(how));
      h.listed = false;
    } else {
      say("node {} is back ({}): the job may use it again from its next discovery",
          printable(node), printable(how));
    }
    reconsider();
    return;
  }
}

// Name resolution and a reachability check run on a thread (neither may block the
// actor; CAF connects one node at a time, so a host that does not answer TCP would
// stall every other connect).
void job::connect_host(const std::string& ep) {
  auto& h = hosts_.at(ep);
  h.st = ehost::status::connecting;
  h.colocator = nullptr;
  h.info = node_info{};
  if (job_.embedded) { // every host in this process (tests)
    h.address = "127.0.0.1";
    return spawn_colocator(ep);
  }
  auto hdl = caf::actor_cast<job_actor>(this);
  std::thread{[hdl, ep, host = h.spec.host, port = h.spec.port] {
    std::string error;
    auto addr = resolve_ipv4(host, &error);
    if (!addr) {
      post_from(hdl, probed_atom::value, ep, std::string{},
                     fmt::format("cannot resolve '{}': {}", host, error));
      return;
    }
    auto r = check_tcp_reachable({{*addr, port}}, std::chrono::milliseconds(3000));
    post_from(hdl, probed_atom::value, ep, *addr,
                   r.empty() || r.front().empty()
                       ? std::string{}
                       : fmt::format("cannot reach it: {}{}", r.front(),
                                     r.front() == std::strerror(ECONNREFUSED)
                                         ? " (is `caf-hvd node` running there?)"
                                         : ""));
  }}.detach();
}

elastic_config job::fixed_policy(const job_config& job) {
  elastic_config ec;
  ec.min_np = job.np;
  ec.max_np = job.np;
  ec.elastic_timeout = job.start_timeout;
  ec.reset_limit = 0;
  return ec;
}

// Ranks are placed over the given slots before anything connects, so hosts that get
// no rank are never contacted; the start-up has one deadline (--start-timeout).
void job::start_fixed_hosts() {
  std::vector<host_slots> hs;
  for (auto& h : job_.hosts)
    hs.push_back({h.endpoint(), static_cast<int>(h.slots)});
  std::vector<slot_info> placed;
  try {
    placed = get_host_assignments(hs, job_.np, job_.np);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  for (size_t i = 0; i < job_.hosts.size(); ++i) {
    auto ep = job_.hosts[i].endpoint();
    int n = static_cast<int>(
        std::count_if(placed.begin(), placed.end(), [&](auto& s) { return s.hostname == ep; }));
    if (n == 0)
      continue;
    ehost h;
    h.spec = job_.hosts[i];
    h.address = i < job_.addresses.size() ? job_.addresses[i] : "127.0.0.1";
    h.listed = true;
    h.planned = n;
    hosts_.emplace(ep, std::move(h));
    listed_order_.push_back(ep);
    if (std::find(ever_listed_.begin(), ever_listed_.end(), ep) == ever_listed_.end())
      ever_listed_.push_back(ep);
  }
  delayed_send(this, job_.start_timeout, deadline_atom::value, uint32_t{dl_start});
  for (auto& ep : listed_order_) {
    if (job_.embedded)
      spawn_colocator(ep);
    else
      connect_agent(ep); // the front end checked that every agent accepts TCP
  }
}

// What a static job's start still waits for, when its deadline passes.
std::string job::start_waits_for() {
  std::vector<std::string> who;
  for (auto& ep : listed_order_) {
    auto& h = hosts_.at(ep);
    if (h.st != ehost::status::ready)
      who.push_back(fmt::format("node agent {} ({})", h.label(),
                                h.colocator ? (h.has_info ? "NIC discovery" : "its node info")
                                : h.nid || job_.embedded ? "its colocator"
                                                         : "connecting"));
  }
  for (auto& [key, row] : gen_.rows) {
    auto* s = current(key);
    if (!s || !s->launched)
      who.push_back(fmt::format("rank {} on {} ({})", row.rank, row.hostname,
                                !s || !s->worker ? "its worker" : "its launch"));
  }
  return who.empty() ? std::string{"nothing (internal error)"}
                     : fmt::format("{}", fmt::join(who, ", "));
}

void job::on_reachable(const std::string& ep, const std::string& problem) {
  auto it = hosts_.find(ep);
  if (it == hosts_.end() || it->second.st != ehost::status::connecting || done_)
    return;
  if (!problem.empty())
    return host_unusable(ep, problem);
  connect_agent(ep);
}

void job::connect_agent(const std::string& ep) {
  connect_queue_.push_back(ep);
  pump_connects();
}

void job::pump_connects() {
  while (connects_in_flight_ < connect_window && !connect_queue_.empty()) {
    auto ep = connect_queue_.front();
    connect_queue_.pop_front();
    ++connects_in_flight_;
    dial(ep);
  }
}

void job::dialed() {
  --connects_in_flight_;
  pump_connects();
}

void job::dial(const std::string& ep) {
  auto& h = hosts_.at(ep);
  auto mm = net::module().connector(system(), job_.tls);
  log("connecting to node agent {} ({})", ep, h.address);
  request(mm, job_.start_timeout, caf::connect_atom::value, h.address, h.spec.port)
      .then(
          [this, ep](caf::node_id& nid, caf::strong_actor_ptr&, std::set<std::string>&) {
            dialed();
            auto& h = hosts_.at(ep);
            for (auto& [other, o] : hosts_)
              if (other != ep && o.nid == nid && (o.st == ehost::status::ready || !elastic_))
                return host_unusable(ep, fmt::format("it is the same node agent as {} (node id {})",
                                                     other, to_string(nid)));
            h.nid = nid;
            events_.emit("host.connected",
                         {{"host", ep}, {"address", h.address}, {"tls", job_.tls}});
            spawn_colocator(ep);
          },
          [this, ep](caf::error& e) {
            // A busy agent (one flooded with connections) may not finish the handshake
            // in time; try again while the start timeout allows.
            if (e == caf::sec::connection_timeout && !done_
                && clock_type::now() - started_ + std::chrono::seconds(1) < job_.start_timeout) {
              log("handshake with {} timed out; trying again", ep);
              return dial(ep); // keeps its place in the window
            }
            dialed();
            auto& h = hosts_.at(ep);
            host_unusable(
                ep, fmt::format("cannot connect: {}",
                                connect_error(e, fmt::format("{}:{}", h.address, h.spec.port))));
          });
}

std::string job::connect_error(const caf::error& e, const std::string& peer) {
  return cafhvd::connect_error(system(), e, job_.tls, peer);
}

void job::spawn_colocator(const std::string& ep) {
  auto& h = hosts_.at(ep);
  auto self_hdl = caf::actor_cast<driver_actor>(this);
  auto coord = caf::actor_cast<coordinator_actor>(coord_);
  auto grace = static_cast<int32_t>(job_.kill_grace.count());
  if (job_.embedded) {
    // By name from this system's factories, as a node agent spawns it for a remote
    // driver (tests put fake node actors behind the same names).
    auto c = system().spawn<colocator_actor>(
        colocator_type_name, caf::make_message(self_hdl, coord, job_id_, grace, signed_ticket{}));
    if (!c)
      return host_unusable(ep, fmt::format("cannot start its colocator: {}", describe(c.error())));
    monitor(*c);
    h.colocator = *c;
    return query_host(ep);
  }
  // The agent runs nothing for a spawn it cannot trace to a driver of its cluster.
  signed_ticket ticket;
  if (job_.creds) {
    try {
      ticket = net::module().sign_ticket(
          *job_.creds,
          // the audience: the agent's node id and the certificate its connection showed
          // (bound to that node id for this process's life), so that no other agent
          // takes the ticket
          ticket_body("colocator", colocator_audience(to_string(h.nid), net::module().certificate_of(h.nid)), job_id_,
                      static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count())));
    } catch (const std::exception& e) {
      return host_unusable(ep, fmt::format("cannot sign its colocator's ticket: {}", e.what()));
    }
  }
  auto mm = net::module().connector(system(), false); // the middleman spawns remotely
  request(mm, job_.start_timeout, caf::spawn_atom::value, h.nid, std::string{colocator_type_name},
          caf::make_message(self_hdl, coord, job_id_, grace, std::move(ticket)),
          system().message_types<colocator_actor>())
      .then(
          [this, ep](caf::strong_actor_ptr& p) {
            auto c = caf::actor_cast<colocator_actor>(std::move(p));
            if (!c)
              return host_unusable(ep, "remote spawn of its colocator returned no actor");
            monitor(c);
            hosts_.at(ep).colocator = c;
            query_host(ep);
          },
          [this, ep](caf::error& e) {
            host_unusable(ep, fmt::format("cannot start its colocator: {}", describe(e)));
          });
}

void job::query_host(const std::string& ep) {
  auto& h = hosts_.at(ep);
  request(h.colocator, job_.start_timeout, node_atom::value)
      .then(
          [this, ep](node_info& info) {
            auto& h = hosts_.at(ep);
            for (auto& [other, o] : hosts_)
              if (other != ep && (o.st == ehost::status::ready || o.has_info)
                  && o.info.name == info.name)
                return host_unusable(
                    ep, fmt::format("node agents {} and {} both call themselves '{}'; give "
                                    "each agent a distinct --name",
                                    other, ep, info.name));
            h.info = std::move(info);
            h.has_info = true;
            // The node's drain state as its agent has it now: an agent that restarted (a
            // rolling upgrade's step) and was undrained is back, whatever the colocator
            // it replaced last said; one that restarted drained stays out.
            if (h.draining != h.info.draining) {
              h.draining = h.info.draining;
              events_.emit("host.draining", {{"host", h.info.name},
                                             {"on", h.draining},
                                             {"how", "as its agent says at connect"}});
              if (elastic_ && !h.draining)
                say("node {} is back (its agent is not drained): the job may use it again "
                    "from its next discovery",
                    h.label());
              if (h.draining)
                h.listed = false;
            }
            if (!h.info.gpus.empty() || job_.gpus_per_slot > 0)
              log("{} has GPUs [{}] ({}), free: [{}]", h.label(), join_devices(h.info.gpus),
                  h.info.gpu_source, join_devices(h.info.gpus_free));
            if (elastic_ && job_.gpus_per_slot > 0)
              return lend_elastic_gpus(ep);
            if (elastic_)
              return choose_nic(ep);
            if (h.info.slots != 0 && h.planned > static_cast<int>(h.info.slots))
              return fail(fmt::format("node {} offers {} slots but the job places {} ranks "
                                      "there",
                                      h.label(), h.info.slots, h.planned));
            for (auto& other : listed_order_)
              if (!hosts_.at(other).has_info)
                return;
            if (job_.gpus_per_slot > 0)
              return lend_fixed_gpus();
            phase("nic");
            choose_fixed_nics();
          },
          [this, ep](caf::error& e) {
            host_unusable(ep, fmt::format("no node info: {}", describe(e)));
          });
}

// A listed slot count above what the agent offers (`caf-hvd node --slots`) is capped.
void job::warn_if_capped(ehost& h) {
  if (h.info.slots == 0 || h.spec.slots <= h.info.slots || h.capped_warned == h.spec.slots)
    return;
  h.capped_warned = h.spec.slots;
  say("warning: host {} is listed with {} slots but its agent offers {}; using {}", h.label(),
      h.spec.slots, h.info.slots, h.info.slots);
}

void job::host_ready(const std::string& ep) {
  auto& h = hosts_.at(ep);
  // Addresses of this machine (the driver's): agents reached at one of them, or over
  // loopback, run here, and reach each other and the job's servers on any of them.
  std::set<std::string> mine;
  for (auto& i : list_interfaces())
    mine.insert(i.address);
  auto here = [&](const ehost& x) {
    return is_loopback_address(x.address) || mine.count(x.address) > 0;
  };
  // The job's servers listen towards its first host: on loopback, remote hosts cannot
  // reach them; a host reached over loopback cannot be reached by remote hosts, so it
  // shares a job only with hosts of this machine.
  if (!serve_bind_.empty() && is_loopback_address(serve_bind_) && !here(h))
    return host_unusable(
        ep, fmt::format("the job's hosts are on this machine (its servers listen on {}), which "
                        "a remote host cannot reach; list every host by an address of the "
                        "shared network",
                        serve_bind_));
  for (auto& [other, o] : hosts_) {
    if (other == ep || o.st != ehost::status::ready)
      continue;
    if (is_loopback_address(h.address) && !here(o))
      return host_unusable(
          ep, fmt::format("it was reached at a loopback address, which the job's host {} on "
                          "another machine cannot reach; list it by an address of the shared "
                          "network",
                          o.label()));
    if (!here(h) && is_loopback_address(o.address))
      return host_unusable(
          ep, fmt::format("the job's host {} on this machine was reached at a loopback "
                          "address, which this host cannot reach; list every host by an "
                          "address of the shared network",
                          o.label()));
  }
  h.st = ehost::status::ready;
  // The job's servers serve the job's hosts (every address their agents reported)
  // and the driver's own machine, no one else.
  std::vector<std::string> addresses{h.reach_address, h.address};
  for (auto& i : h.info.interfaces)
    addresses.push_back(i.address);
  // A host whose agent runs on this machine is spoken for by loopback clients (the
  // allowlist drops a remote host's loopback addresses). A remote host's addresses that
  // this machine has too (docker0's 172.17.0.1, libvirt's 192.168.122.1) are this
  // machine's here: a local process bound to one must not speak for that host.
  bool local = here(h);
  if (!local)
    std::erase_if(addresses, [&](const std::string& a) { return mine.count(a) > 0; });
  send(coord_, allow_atom::value, h.info.name, std::move(addresses), local, h.info.rank_uid);
  if (elastic_)
    warn_if_capped(h);
  h.last_warning.clear();
  log("host {} ready: {} slots, interfaces {}, reached at {}", h.label(), h.slots(),
      fmt::join(h.nics, ","), h.reach_address);
  if (!host_end_.count(h.info.name))
    used_hosts_.push_back(h.info.name);
  host_end_[h.info.name] = "";
  events_.emit("host.ready", {{"host", h.info.name},
                              {"endpoint", job_.embedded ? std::string{"localhost"} : ep},
                              {"address", h.reach_address},
                              {"interfaces", h.nics},
                              {"slots", elastic_ ? h.slots() : h.planned}});
  if (serve_bind_.empty())
    return start_servers(h); // reconsiders once they are up
  reconsider();
}

void job::host_unusable(const std::string& ep, const std::string& why) {
  auto it = hosts_.find(ep);
  if (it == hosts_.end())
    return;
  auto& h = it->second;
  if (!elastic_)
    return fail(fmt::format("node agent {}: {}", h.label(), why));
  if (h.colocator)
    send_exit(h.colocator, caf::exit_reason::user_shutdown);
  h.colocator = nullptr;
  h.st = ehost::status::unusable;
  h.retry_at =
      clock_type::now() + std::max(ec_.discovery_interval, std::chrono::milliseconds(5000));
  if (why != h.last_warning) {
    say("warning: discovered host {} is not used (trying again while it is listed): {}", ep, why);
    events_.emit("host.unusable", {{"host", ep}, {"cause", why}});
  }
  h.last_warning = why;
  reconsider();
}

// The job's servers (the coordinator's) listen on the driver's address towards the
// first host.
void job::start_servers(const ehost& h) {
  std::string bind = "127.0.0.1";
  if (!is_loopback_address(h.address)) {
    auto a = local_address_towards(h.address);
    if (!a)
      return fail(fmt::format("no local address routes to node {} ({})", h.label(), h.address));
    bind = *a;
  }
  serve_bind_ = bind;
  request(coord_, job_.start_timeout, serve_atom::value, bind)
      .then(
          [this](served& up) {
            if (!up.error.empty())
              return fail(up.error);
            served_ = std::move(up);
            // the wait for a first ready host ended: --min-np's wait starts now
            waiting_slots_ = slot_wait_told_ = false;
            reconsider();
          },
          [this](caf::error& e) {
            fail(fmt::format("the job's coordinator did not start its servers: {}", describe(e)));
          });
}

void job::blacklist(const std::string& ep) {
  auto& h = hosts_.at(ep);
  if (h.blacklisted)
    return;
  h.blacklisted = true;
  ++h.failures;
  if (auto it = host_end_.find(h.info.name); it != host_end_.end() && it->second.empty())
    it->second = "blacklisted"; // a lost host stays "lost" (the blacklist line names it)
  if (ec_.cooldown) {
    auto delay = cooldown_delay(*ec_.cooldown, h.failures,
                                std::uniform_real_distribution<double>(0, 1)(rng_));
    h.cooldown_end = clock_type::now() + delay;
    say("host {} is blacklisted for {:.1f} s (failure {})", h.info.name, delay.count() / 1000.0,
        h.failures);
    events_.emit("host.blacklisted", {{"host", h.info.name},
                                      {"failures", h.failures},
                                      {"cooldown_seconds", delay.count() / 1000.0}});
  } else {
    say("host {} is blacklisted for the rest of the job", h.info.name);
    events_.emit("host.blacklisted",
                 {{"host", h.info.name}, {"failures", h.failures}, {"cooldown_seconds", nullptr}});
  }
  // Its other ranks stop: SIGTERM now, SIGKILL after the grace period.
  for (auto& [id, s] : slots_) {
    if (s.endpoint != ep || !s.running)
      continue;
    send(coord_, leave_atom::value, s.key);
    if (drop_if_unlaunched(s))
      continue;
    s.retired = true;
    if (s.worker)
      send(s.worker, terminate_atom::value, int32_t{SIGTERM});
    delayed_send(this, job_.kill_grace, retire_atom::value, s.id, int32_t{SIGKILL});
  }
}

void job::on_down(const caf::down_msg& dm) {
  if (dm.source == coord_.address()) {
    if (!finished_)
      fail(fmt::format("the job's coordinator ended: {}", describe(dm.reason)));
    return;
  }
  if (dm.reason == caf::exit_reason::normal)
    return;
  for (auto& [ep, h] : hosts_) {
    bool ours = h.colocator && h.colocator.address() == dm.source;
    for (auto& [id, s] : slots_)
      ours = ours || (s.endpoint == ep && s.worker && s.worker.address() == dm.source
                      // a worker the job ended itself (dropped before it launched): a
                      // remote actor's down message may come despite the demonitor
                      && !(s.retired && !s.running));
    if (!ours || h.st == ehost::status::lost)
      continue;
    auto why = dm.reason == caf::exit_reason::remote_link_unreachable
                   ? std::string{"connection lost (agent dead, hung or unreachable)"}
               : dm.reason == caf::exit_reason::user_shutdown
                   ? std::string{"the node agent was shut down"}
                   : describe(dm.reason);
    bool was_ready = h.st == ehost::status::ready;
    h.st = ehost::status::lost;
    events_.emit("host.lost", {{"host", h.info.name.empty() ? ep : h.info.name}, {"cause", why}});
    // An agent of a host the job removed (a drained node's agent exits once its ranks are
    // gone) leaves no loss behind unless ranks of the job still ran there.
    auto end = host_end_.find(h.info.name);
    bool removed = end != host_end_.end() && end->second == "removed";
    if (end != host_end_.end() && !removed)
      end->second = "lost";
    h.colocator = nullptr;
    bool had_ranks = false;
    bool newcomers_only = only_newcomers_on(ep);
    for (auto& [id, s] : slots_) {
      if (s.endpoint != ep || !s.running)
        continue;
      s.running = false;
      if (executor())
        fail_calls(s, fmt::format("rank {} on host {} was lost: {}", s.rank, h.label(), why));
      if (!s.retired && in_plan(s.key))
        had_ranks = true;
      s.retired = true;
      send(coord_, leave_atom::value, s.key);
    }
    if (done_)
      return maybe_finish();
    if (!elastic_) {
      if (!all_started_)
        return fail(fmt::format("lost node agent {}: {}", h.label(), why));
      if (had_ranks && !failure_ && !interrupted_) {
        failure_ = fmt::format("node {} was lost while its ranks ran: {}", h.label(), why);
        failure_said_ = true;
        say("{}{}", *failure_, listed_order_.size() > 1 ? "; stopping the other ranks" : "");
        teardown();
      }
      return maybe_finish();
    }
    auto what = fmt::format("node agent {} was lost: {}", h.label(), why);
    if (had_ranks && !finishing_) {
      note_failure(what);
      if (newcomers_only) {
        // only newcomers of a plan not released yet ran there: the running ranks go on
        say("{}; only newcomers of generation {} ran there: the running ranks go on", what,
            gen_.number);
        blacklist(ep);
        reconsider();
        return maybe_finish();
      }
      say("{}", what);
      blacklist(ep);
      break_generation(ep);
      abort_gloo();
      reconsider();
    } else if (had_ranks) {
      // The job was ending (a rank of the final generation exited 0): the ranks of the
      // lost host may have finished too, but their exits were not seen, so the job
      // cannot claim success. Say so, rather than only that a host was lost.
      what = fmt::format("node agent {} was lost after a rank of the final generation had "
                         "finished ({}); the exits of its ranks were not seen, so the job "
                         "cannot report success",
                         h.label(), why);
      note_failure(what);
      if (!failure_)
        failure_ = what;
    } else if (was_ready) {
      if (removed)
        log("{} (the job had left that host)", what);
      else
        say("warning: {}", what);
      reconsider();
    }
    return maybe_finish();
  }
}

} // namespace cafhvd::driver_impl
