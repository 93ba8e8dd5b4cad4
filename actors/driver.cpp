// Driver actor. Phases of a job, in order:
//   connect     reach every node agent that gets ranks
//   place       spawn a colocator per node and a worker per rank there
//   register    workers report their hostname; the coordinator computes local/cross ranks
//   rendezvous  the coordinator starts the HTTP rendezvous server with the job's plan
//   nic         choose the interface each host uses to reach the others
//   launch      every worker receives its environment and starts the command
//   run         stream output, watch exits and node liveness
//   teardown    SIGTERM, grace period, SIGKILL, release every remote actor
#include "actors/driver.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <optional>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/config.hpp"
#include "actors/driver_util.hpp"

#include <caf/openssl/all.hpp>
#include "actors/coordinator.hpp"
#include "actors/node_actors.hpp"
#include "runtime/assignment.hpp"
#include "runtime/env.hpp"
#include "runtime/nic.hpp"
#include "runtime/nic_probe.hpp"

namespace cafhvd {

namespace {

enum class phase : uint32_t {
  connect,
  place,
  register_ranks,
  rendezvous,
  nic,
  launch,
  run,
  teardown
};

const char* phase_name(phase p) {
  static const char* names[] = {"connect", "place",  "register", "rendezvous",
                                "nic",     "launch", "run",      "teardown"};
  return names[static_cast<uint32_t>(p)];
}

struct node_entry {
  host_spec spec;
  std::string address;    // IPv4 the driver reaches the agent at
  std::vector<int> ranks; // ranks placed on this node, ascending
  caf::node_id nid;       // remote nodes only
  colocator_actor colocator;
  node_info info;
  bool lost = false;
  bool embedded = false;
  std::string reach_address; // where the other hosts reach it (NIC discovery)
  std::string label() const {
    if (embedded)
      return info.name;
    if (info.name.empty())
      return spec.endpoint();
    return fmt::format("{} ({})", info.name, spec.endpoint());
  }
};

struct rank_entry {
  int node = 0;
  worker_actor worker;
  std::string hostname;
  rank_info info;
  bool exited = false;
  int out_fd[2] = {-1, -1};
};

class driver_impl : public driver_full_actor::base {
public:
  driver_impl(caf::actor_config& cfg, job_config job, std::shared_ptr<job_result> result)
      : driver_full_actor::base(cfg), job_(std::move(job)), result_(std::move(result)) {}

  behavior_type make_behavior() override {
    started_ = std::chrono::steady_clock::now();
    job_id_ = make_job_id();
    coordinator_ = spawn(coordinator_fn);
    set_down_handler([this](caf::down_msg& dm) { on_down(dm); });
    place_ranks();
    delayed_send(this, job_.start_timeout, deadline_atom::value, uint32_t{0});
    if (!failed_)
      enter_connect();
    return {
        [this](output_atom, output_batch& b) -> caf::result<caf::ok_atom> {
          print_output(b);
          return output_acks_.after_write(this);
        },
        [this](output_atom, uint64_t id) { output_acks_.written(id); },
        [this](exited_atom, rank_exit& ex) { on_exit(ex); },
        [this](interrupt_atom, int32_t sig) { on_interrupt(sig); },
        [this](deadline_atom, uint32_t which) { on_deadline(which); },
        [this](tstore_atom, std::string& problem) { on_store_problem(problem); },
    };
  }

private:
  // -- helpers ------------------------------------------------------------------------

  long elapsed_ms() const {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now() - started_)
                                 .count());
  }

  template <class... Ts> void log(fmt::format_string<Ts...> f, Ts&&... xs) {
    if (job_.verbose)
      write_all(2, fmt::format("caf-hvd [{:>5} ms] {}: {}\n", elapsed_ms(), phase_name(phase_),
                               fmt::format(f, std::forward<Ts>(xs)...)));
  }

  std::chrono::milliseconds remaining() const {
    auto left = job_.start_timeout - std::chrono::milliseconds(elapsed_ms());
    return std::max(left, std::chrono::milliseconds(1));
  }

  std::string describe(const caf::error& e) { return system().render(e); }

  void enter(phase p) {
    phase_ = p;
    waiting_.clear();
    log("begins");
  }

  // Called when the current phase's last answer is in.
  void answered(const std::string& who) {
    waiting_.erase(who);
    if (waiting_.empty() && !failed_)
      next_phase();
  }

  void next_phase() {
    switch (phase_) {
    case phase::connect:
      enter_place();
      break;
    case phase::place:
      enter_register();
      break;
    case phase::register_ranks:
      enter_rendezvous();
      break;
    case phase::rendezvous:
      enter_nic();
      break;
    case phase::nic:
      enter_launch();
      break;
    case phase::launch:
      enter_run();
      break;
    default:
      break;
    }
  }

  // -- placement (before anything starts) ----------------------------------------------

  void place_ranks() {
    std::vector<host_slots> hs;
    for (size_t i = 0; i < job_.hosts.size(); ++i)
      hs.push_back({job_.hosts[i].endpoint(), static_cast<int>(job_.hosts[i].slots)});
    std::vector<slot_info> slots;
    try {
      slots = get_host_assignments(hs, job_.np, job_.np);
    } catch (const std::exception& e) {
      return fail_start(e.what());
    }
    for (size_t i = 0; i < job_.hosts.size(); ++i) {
      node_entry n;
      n.spec = job_.hosts[i];
      n.address = i < job_.addresses.size() ? job_.addresses[i] : "127.0.0.1";
      n.embedded = job_.embedded;
      for (auto& s : slots)
        if (s.hostname == n.spec.endpoint())
          n.ranks.push_back(s.rank);
      if (!n.ranks.empty())
        nodes_.push_back(std::move(n));
    }
    ranks_.resize(job_.np);
    for (size_t i = 0; i < nodes_.size(); ++i)
      for (int r : nodes_[i].ranks)
        ranks_[r].node = static_cast<int>(i);
  }

  // -- connect ----------------------------------------------------------------------

  void enter_connect() {
    enter(phase::connect);
    if (job_.embedded)
      return next_phase();
    // Through the OpenSSL module, the connection is mutual TLS; remote spawns then use
    // that connection (one BASP broker serves both).
    auto mm =
        job_.tls ? system().openssl_manager().actor_handle() : system().middleman().actor_handle();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      waiting_.insert(fmt::format("node agent {}", nodes_[i].spec.endpoint()));
      connect_node(mm, i);
    }
  }

  void connect_node(const caf::io::middleman_actor& mm, size_t i) {
    auto who = fmt::format("node agent {}", nodes_[i].spec.endpoint());
    request(mm, remaining(), caf::connect_atom::value, nodes_[i].address, nodes_[i].spec.port)
        .then(
            [this, i, who](caf::node_id& nid, caf::strong_actor_ptr&, std::set<std::string>&) {
              for (size_t j = 0; j < nodes_.size(); ++j)
                if (j != i && nodes_[j].nid == nid)
                  return fail_start(fmt::format(
                      "{} and {} are the same node agent (node id {}); list each agent once",
                      nodes_[j].spec.endpoint(), nodes_[i].spec.endpoint(), to_string(nid)));
              nodes_[i].nid = nid;
              log("connected to {}", nodes_[i].spec.endpoint());
              answered(who);
            },
            [this, i, mm](caf::error& e) {
              // A busy agent (for instance one flooded with connections) may not finish the
              // handshake in time; try again while the start timeout allows.
              if (e == caf::sec::connection_timeout && remaining() > std::chrono::seconds(1)
                  && !failed_) {
                log("handshake with {} timed out; trying again", nodes_[i].spec.endpoint());
                return connect_node(mm, i);
              }
              fail_start(fmt::format("cannot connect to node agent {} ({}): {}",
                                     nodes_[i].spec.endpoint(), nodes_[i].address,
                                     connect_error(e)));
            });
  }

  std::string connect_error(const caf::error& e) {
    return cafhvd::connect_error(system(), e, job_.tls);
  }

  // -- place ----------------------------------------------------------------------------

  template <class Handle, class F>
  void spawn_on(size_t node, const char* type, const std::string& who, caf::message args,
                F on_spawned) {
    waiting_.insert(who);
    auto mm = system().middleman().actor_handle();
    request(mm, remaining(), caf::spawn_atom::value, nodes_[node].nid, std::string{type},
            std::move(args), system().message_types<Handle>())
        .then(
            [this, who, on_spawned](caf::strong_actor_ptr& p) {
              auto hdl = caf::actor_cast<Handle>(std::move(p));
              if (!hdl)
                return fail_start(fmt::format("{}: remote spawn returned no actor", who));
              on_spawned(hdl);
              answered(who);
            },
            [this, who](caf::error& e) {
              fail_start(fmt::format("cannot start {}: {}", who, describe(e)));
            });
  }

  void enter_place() {
    enter(phase::place);
    auto self_hdl = caf::actor_cast<driver_actor>(this);
    auto grace = static_cast<int32_t>(job_.kill_grace.count());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      auto with_colocator = [this, i](colocator_actor c) {
        monitor(c);
        nodes_[i].colocator = c;
        query_node(i);
      };
      if (job_.embedded) {
        waiting_.insert("colocator");
        with_colocator(spawn(colocator_fn, self_hdl, job_id_, grace));
        answered("colocator");
      } else {
        spawn_on<colocator_actor>(i, colocator_type_name,
                                  fmt::format("colocator on {}", nodes_[i].spec.endpoint()),
                                  caf::make_message(self_hdl, job_id_, grace), with_colocator);
      }
    }
  }

  void query_node(size_t i) {
    auto who = fmt::format("node info of {}", nodes_[i].spec.endpoint());
    waiting_.insert(who);
    request(nodes_[i].colocator, remaining(), node_atom::value)
        .then(
            [this, i, who](node_info& info) {
              auto& n = nodes_[i];
              n.info = std::move(info);
              if (n.info.slots != 0 && n.ranks.size() > n.info.slots)
                return fail_start(fmt::format("node {} offers {} slots but the job places {} ranks "
                                              "there",
                                              n.label(), n.info.slots, n.ranks.size()));
              for (size_t j = 0; j < nodes_.size(); ++j)
                if (j != i && nodes_[j].info.name == n.info.name)
                  return fail_start(fmt::format(
                      "node agents {} and {} both call themselves '{}'; give each agent a distinct "
                      "--name",
                      nodes_[j].spec.endpoint(), n.spec.endpoint(), n.info.name));
              spawn_workers(i);
              answered(who);
            },
            [this, who](caf::error& e) { fail_start(fmt::format("{}: {}", who, describe(e))); });
  }

  void spawn_workers(size_t i) {
    auto self_hdl = caf::actor_cast<driver_actor>(this);
    auto& n = nodes_[i];
    for (int r : n.ranks) {
      auto with_worker = [this, r](worker_actor w) {
        monitor(w);
        ranks_[r].worker = w;
      };
      if (job_.embedded) {
        with_worker(spawn(worker_fn, n.colocator, self_hdl, static_cast<uint32_t>(r)));
      } else {
        spawn_on<worker_actor>(
            i, worker_type_name, fmt::format("worker of rank {} on {}", r, n.spec.endpoint()),
            caf::make_message(n.colocator, self_hdl, static_cast<uint32_t>(r)), with_worker);
      }
    }
  }

  // -- register ----------------------------------------------------------------------

  void enter_register() {
    enter(phase::register_ranks);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      auto who = fmt::format("rank {} on {}", r, nodes_[ranks_[r].node].label());
      waiting_.insert(who);
      request(ranks_[r].worker, remaining(), hostname_atom::value)
          .then(
              [this, r, who](std::string& host) {
                ranks_[r].hostname = std::move(host);
                waiting_.erase(who);
                if (waiting_.empty())
                  register_all();
              },
              [this, who](caf::error& e) { fail_start(fmt::format("{}: {}", who, describe(e))); });
    }
  }

  // Horovod registers in rank order; the coordinator's node order follows from it.
  void register_all() {
    waiting_.insert("coordinator");
    for (size_t r = 0; r < ranks_.size(); ++r) {
      auto& n = nodes_[ranks_[r].node];
      auto key = job_.embedded ? std::string{"local"} : to_string(n.nid);
      request(coordinator_, remaining(), register_atom::value, ranks_[r].hostname, key,
              static_cast<uint32_t>(r))
          .then([](caf::ok_atom) {},
                [this](caf::error& e) { fail_start("registration: " + describe(e)); });
    }
    request(coordinator_, remaining(), finalize_atom::value)
        .then(
            [this](std::vector<rank_info>& infos) {
              for (auto& i : infos)
                ranks_[i.rank].info = i;
              log("local/cross ranks computed for {} ranks on {} hosts", infos.size(),
                  nodes_.size());
              answered("coordinator");
            },
            [this](caf::error& e) { fail_start("rank registration: " + describe(e)); });
  }

  // -- rendezvous ------------------------------------------------------------------------

  // The coordinator's rendezvous server listens on the driver's address towards the
  // nodes (loopback when every node is on loopback), never on every interface.
  void enter_rendezvous() {
    enter(phase::rendezvous);
    auto& first = nodes_.front().address;
    if (job_.embedded || is_loopback_address(first)) {
      rendezvous_addr_ = "127.0.0.1";
    } else if (auto a = local_address_towards(first)) {
      rendezvous_addr_ = *a;
    } else {
      return fail_start(
          fmt::format("no local address routes to node {} ({})", nodes_.front().label(), first));
    }
    waiting_.insert("rendezvous server");
    request(coordinator_, remaining(), rendezvous_atom::value, rendezvous_addr_)
        .then(
            [this](uint16_t port) {
              rendezvous_port_ = port;
              log("rendezvous server on {}:{}", rendezvous_addr_, port);
              answered("rendezvous server");
            },
            [this](caf::error& e) { fail_start("rendezvous server: " + describe(e)); });
  }

  // -- nic ---------------------------------------------------------------------------

  void enter_nic() {
    enter(phase::nic);
    size_t loopback = 0;
    for (auto& n : nodes_)
      if (job_.embedded || is_loopback_address(n.address))
        ++loopback;
    if (loopback != 0 && loopback != nodes_.size()) {
      std::string lo_nodes;
      for (auto& n : nodes_)
        if (is_loopback_address(n.address))
          lo_nodes += (lo_nodes.empty() ? "" : ", ") + n.label();
      return fail_start(fmt::format(
          "nodes {} were reached at a loopback address, which the job's other hosts cannot "
          "reach; name them by an address of the shared network",
          lo_nodes));
    }
    if (loopback != 0) {
      // Every node is on this machine: loopback serves (and --network-interface, if
      // given, must name it).
      for (auto& n : nodes_) {
        auto lo = loopback_name(n.info);
        if (!job_.network_interfaces.empty()
            && std::find(job_.network_interfaces.begin(), job_.network_interfaces.end(), lo)
                   == job_.network_interfaces.end())
          return fail_start(fmt::format(
              "--network-interface: every node of this job is on this machine and talks over {}, "
              "which is not among the named interfaces",
              lo));
        n.reach_address = "127.0.0.1";
        nics_[n.info.name] = {lo};
      }
      return next_phase();
    }
    if (nodes_.size() == 1) {
      // One host: nothing to reach. The interfaces named by --network-interface that it
      // has (an error if none), else the one the driver reached it through.
      auto& n = nodes_.front();
      n.reach_address = n.address;
      auto& nics = nics_[n.info.name];
      if (!job_.network_interfaces.empty()) {
        try {
          for (auto& a :
               candidate_interfaces({n.info.name, n.info.interfaces}, job_.network_interfaces))
            if (std::find(nics.begin(), nics.end(), a.name) == nics.end()) {
              if (nics.empty())
                n.reach_address = a.address;
              nics.push_back(a.name);
            }
        } catch (const std::exception& e) {
          return fail_start(fmt::format("NIC discovery: {}", e.what()));
        }
        return next_phase();
      }
      for (auto& a : n.info.interfaces)
        if (a.address == n.address)
          nics = {a.name};
      if (nics.empty())
        nics = {loopback_name(n.info)};
      return next_phase();
    }
    probe_all();
  }

  // Every node probes every other node's candidate addresses from each of its own
  // candidate interfaces; all nodes at once.
  void probe_all() {
    std::vector<host_interfaces> hosts;
    std::vector<std::vector<interface_addr>> candidates;
    for (auto& n : nodes_) {
      hosts.push_back({n.info.name, n.info.interfaces});
      try {
        candidates.push_back(candidate_interfaces(hosts.back(), job_.network_interfaces));
      } catch (const std::exception& e) {
        return fail_start(fmt::format("NIC discovery: {}", e.what()));
      }
    }
    auto results = std::make_shared<std::vector<std::vector<probe_result>>>(nodes_.size());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      std::vector<probe_target> targets;
      for (size_t j = 0; j < nodes_.size(); ++j)
        if (j != i)
          for (auto& a : candidates[j])
            targets.push_back({nodes_[j].info.name, a.address, nodes_[j].info.probe_port});
      auto who = fmt::format("NIC probes of {}", nodes_[i].label());
      waiting_.insert(who);
      request(nodes_[i].colocator, remaining(), probe_atom::value, std::move(targets),
              job_.network_interfaces)
          .then(
              [this, i, who, results, hosts](std::vector<probe_result>& r) {
                for (auto& p : r)
                  log("probe {} {} -> {} {}: {}", nodes_[i].info.name, p.iface, p.host, p.address,
                      p.ok ? "ok" : p.error);
                (*results)[i] = std::move(r);
                if (waiting_.size() == 1 && waiting_.count(who)) {
                  try {
                    for (auto& c : choose_interfaces(hosts, *results, job_.network_interfaces)) {
                      nics_[c.host] = c.usable;
                      for (auto& n : nodes_)
                        if (n.info.name == c.host)
                          n.reach_address = c.address;
                    }
                  } catch (const std::exception& e) {
                    return fail_start(e.what());
                  }
                  for (auto& n : nodes_)
                    log("{} uses {} (usable: {}), reached at {}", n.label(), nics_[n.info.name][0],
                        fmt::join(nics_[n.info.name], ","), n.reach_address);
                }
                answered(who);
              },
              [this, who](caf::error& e) { fail_start(fmt::format("{}: {}", who, describe(e))); });
    }
  }

  // -- launch --------------------------------------------------------------------------

  // MASTER_PORT: by default the port of a torch store that rank 0's colocator serves
  // (as torchrun's agent does); with --free-master-port just a port free on that host.
  void enter_launch() {
    enter(phase::launch);
    auto& n0 = nodes_[ranks_[0].node];
    auto who = std::string{"MASTER_PORT on rank 0's host"};
    waiting_.insert(who);
    auto on_port = [this, who](int32_t port) {
      if (port <= 0)
        return fail_start("rank 0's host found no free port for MASTER_PORT");
      master_port_ = port;
      launch_all();
      answered(who);
    };
    auto on_error = [this, who](caf::error& e) { fail_start(who + ": " + describe(e)); };
    if (job_.torch_store != torch_store_mode::off)
      request(n0.colocator, remaining(), tstore_atom::value, n0.reach_address)
          .then(on_port, on_error);
    else
      request(n0.colocator, remaining(), port_atom::value).then(on_port, on_error);
  }

  void open_output_files(int r) {
    auto dir = fmt::format("{}/rank.{}", job_.output_dir, r);
    ::mkdir(dir.c_str(), 0755);
    const char* names[2] = {"stdout", "stderr"};
    for (int s = 0; s < 2; ++s) {
      auto path = fmt::format("{}/{}", dir, names[s]);
      ranks_[r].out_fd[s] = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (ranks_[r].out_fd[s] < 0)
        write_all(
            2, fmt::format("caf-hvd: warning: cannot write {}: {}\n", path, std::strerror(errno)));
    }
  }

  void launch_all() {
    auto& master = nodes_[ranks_[0].node];
    for (size_t r = 0; r < ranks_.size(); ++r) {
      auto& re = ranks_[r];
      auto& n = nodes_[re.node];
      if (!job_.output_dir.empty())
        open_output_files(static_cast<int>(r));
      rank_env_input in;
      in.rank = static_cast<int>(r);
      in.size = static_cast<int>(ranks_.size());
      in.local_rank = re.info.local_rank;
      in.local_size = re.info.local_size;
      in.cross_rank = re.info.cross_rank;
      in.cross_size = re.info.cross_size;
      in.group_rank = re.node;
      in.hostname = re.hostname;
      in.master_addr = master.reach_address;
      in.master_port = master_port_;
      in.agent_store = job_.torch_store != torch_store_mode::off;
      in.nccl_ifaces = nics_[n.info.name];
      in.iface = in.nccl_ifaces.empty() ? std::string{} : in.nccl_ifaces.front();
      in.rendezvous_addr = rendezvous_addr_;
      in.rendezvous_port = rendezvous_port_;
      in.base = job_.base_env;
      in.extra = job_.extra_env;
      launch_spec spec{job_.command, build_rank_env(in), job_.cwd};
      spec.env.push_back("PWD=" + job_.cwd);
      auto who = fmt::format("launch of rank {} on {}", r, n.label());
      waiting_.insert(who);
      request(re.worker, remaining(), launch_atom::value, std::move(spec))
          .then(
              [this, r, who](int32_t pid) {
                log("rank {} started (pid {})", r, pid);
                answered(who);
              },
              [this, who](caf::error& e) { fail_start(fmt::format("{}: {}", who, describe(e))); });
    }
  }

  // -- run -----------------------------------------------------------------------------

  void enter_run() {
    enter(phase::run);
    log("all {} ranks started", ranks_.size());
    maybe_finish();
  }

  void print_output(const output_batch& b) {
    if (b.rank >= ranks_.size())
      return;
    int s = b.stream == 1 ? 1 : 0;
    write_lines(s == 1 ? 2 : 1, b.lines, output_tag(static_cast<int>(b.rank), s));
    if (int fd = ranks_[b.rank].out_fd[s]; fd >= 0)
      write_lines(fd, b.lines);
  }

  void on_exit(const rank_exit& ex) {
    if (ex.rank >= ranks_.size() || ranks_[ex.rank].exited)
      return;
    auto& re = ranks_[ex.rank];
    re.exited = true;
    exit_status st{ex.code, ex.signal, ex.exec_error};
    auto how = describe_exit(st, ex.stopped_by);
    auto host = ex.host.empty() ? nodes_[re.node].label() : ex.host;
    log("rank {} on {} ended: {}", ex.rank, host, how);
    if (st.launcher_code() != 0 && !failure_ && !interrupted_ && phase_ != phase::teardown) {
      failure_ = fmt::format("rank {} on host {} failed first: {}", ex.rank, host, how);
      failure_code_ = st.launcher_code();
      write_all(2, fmt::format("caf-hvd: rank {} on host {} {} {}{}\n", ex.rank, host,
                               st.exec_error.empty() ? "ended with" : "could not start:", how,
                               ranks_.size() > 1 ? "; stopping the other ranks" : ""));
      begin_teardown();
    }
    maybe_finish();
  }

  void maybe_finish() {
    if (phase_ < phase::launch)
      return;
    for (auto& re : ranks_)
      if (!re.exited && !nodes_[re.node].lost)
        return;
    if (phase_ == phase::launch && !waiting_.empty())
      return; // a launch reply is still due; exits can overtake it
    finish();
  }

  // -- failures, interrupts, deadlines -------------------------------------------------

  void on_down(const caf::down_msg& dm) {
    if (dm.reason == caf::exit_reason::normal)
      return;
    for (auto& n : nodes_) {
      bool ours = n.colocator.address() == dm.source;
      for (int r : n.ranks)
        ours = ours || ranks_[r].worker.address() == dm.source;
      if (!ours || n.lost)
        continue;
      n.lost = true;
      bool pending = false;
      for (int r : n.ranks)
        pending = pending || !ranks_[r].exited;
      auto why = dm.reason == caf::exit_reason::remote_link_unreachable
                     ? std::string{"connection lost (agent dead, hung or unreachable)"}
                 : dm.reason == caf::exit_reason::user_shutdown
                     ? std::string{"the node agent was shut down"}
                     : describe(dm.reason);
      if (phase_ < phase::launch)
        return fail_start(fmt::format("lost node agent {}: {}", n.label(), why));
      if (!pending)
        return maybe_finish();
      if (!failure_ && !interrupted_) {
        failure_ = fmt::format("node {} was lost while its ranks ran: {}", n.label(), why);
        failure_code_ = 1;
        write_all(2, fmt::format("caf-hvd: {}{}\n", *failure_,
                                 nodes_.size() > 1 ? "; stopping the other ranks" : ""));
      }
      begin_teardown();
      return maybe_finish();
    }
  }

  // The first problem is printed with what to do; with --torch-store on it also ends
  // the job, rather than leaving the rank to fail at its own store timeout.
  void on_store_problem(const std::string& problem) {
    if (store_problems_++ == 0)
      write_all(2, torch_store_problem_message(problem));
    if (job_.torch_store != torch_store_mode::on || failure_ || interrupted_
        || phase_ == phase::teardown)
      return;
    failure_ = "the torch store could not serve a client (--torch-store on)";
    failure_code_ = 1;
    if (phase_ < phase::launch)
      return fail_start(*failure_);
    begin_teardown();
    maybe_finish();
  }

  void on_interrupt(int32_t sig) {
    if (interrupted_) { // a second interrupt: no more grace
      for (auto& n : nodes_)
        if (n.colocator && !n.lost)
          send(n.colocator, kill_atom::value);
      return;
    }
    interrupted_ = sig;
    write_all(2, fmt::format("caf-hvd: received {}; stopping the job\n", strsignal(sig)));
    if (phase_ < phase::launch)
      return fail_start_code(fmt::format("interrupted by {}", strsignal(sig)), 128 + sig);
    begin_teardown();
    maybe_finish();
  }

  void on_deadline(uint32_t which) {
    if (which == 0 && phase_ < phase::run && !failed_) {
      std::string who;
      for (auto& w : waiting_)
        who += (who.empty() ? "" : ", ") + w;
      fail_start(fmt::format("start timeout ({} s) expired in phase '{}' waiting for: {}",
                             job_.start_timeout.count() / 1000.0, phase_name(phase_),
                             who.empty() ? "nothing (internal error)" : who));
    } else if (which == 1 && phase_ == phase::teardown) {
      std::string who;
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (!ranks_[r].exited && !nodes_[ranks_[r].node].lost)
          who += fmt::format("{}{}", who.empty() ? "" : ", ", r);
      write_all(2, fmt::format("caf-hvd: ranks {} did not report their end within the grace "
                               "period; releasing their nodes\n",
                               who));
      finish();
    }
  }

  void begin_teardown() {
    if (phase_ == phase::teardown)
      return;
    enter(phase::teardown);
    for (auto& n : nodes_)
      if (n.colocator && !n.lost)
        send(n.colocator, terminate_atom::value, static_cast<int32_t>(job_.kill_grace.count()));
    delayed_send(this, job_.kill_grace + std::chrono::seconds(5), deadline_atom::value,
                 uint32_t{1});
  }

  void fail_start(const std::string& msg) { fail_start_code(msg, 1); }

  // A failure before every rank runs: nothing to wait for but the actors we spawned.
  void fail_start_code(const std::string& msg, int code) {
    if (failed_)
      return;
    failed_ = true;
    write_all(2, fmt::format("caf-hvd: error: {}\n", msg));
    failure_code_ = code;
    bool any_started = false;
    for (auto& n : nodes_)
      if (n.colocator && !n.lost)
        any_started = true;
    if (phase_ >= phase::launch && any_started) {
      failure_ = msg;
      begin_teardown();
      return maybe_finish();
    }
    finish();
  }

  void finish() {
    for (auto& re : ranks_) {
      if (re.worker)
        send_exit(re.worker, caf::exit_reason::user_shutdown);
      for (int& fd : re.out_fd)
        if (fd >= 0) {
          close_output(fd);
          fd = -1;
        }
    }
    for (auto& n : nodes_)
      if (n.colocator)
        send_exit(n.colocator, caf::exit_reason::user_shutdown);
    send_exit(coordinator_, caf::exit_reason::user_shutdown);
    int code = 0;
    if (interrupted_)
      code = 128 + interrupted_;
    else if (failure_ || failed_)
      code = failure_code_;
    if (failure_ && !failed_)
      write_all(2, fmt::format("caf-hvd: job failed: {}\n", *failure_));
    log("job ends with exit code {}", code);
    result_->exit_code = code;
    quit();
  }

  job_config job_;
  std::string job_id_; // names the job in node agents' messages
  std::shared_ptr<job_result> result_;
  std::chrono::steady_clock::time_point started_;
  phase phase_ = phase::connect;
  std::set<std::string> waiting_;
  std::vector<node_entry> nodes_;
  std::vector<rank_entry> ranks_;
  std::map<std::string, std::vector<std::string>> nics_; // node name -> usable interfaces
  coordinator_actor coordinator_;
  int master_port_ = 0;
  std::string rendezvous_addr_;
  int rendezvous_port_ = 0;
  std::optional<std::string> failure_;
  int failure_code_ = 1;
  int store_problems_ = 0;
  output_acks output_acks_;
  int interrupted_ = 0;
  bool failed_ = false;
};

} // namespace

driver_full_actor spawn_driver(caf::actor_system& sys, job_config job,
                               std::shared_ptr<job_result> result) {
  if (job.elastic)
    return spawn_elastic_driver(sys, std::move(job), std::move(result));
  return sys.spawn<driver_impl>(std::move(job), std::move(result));
}

} // namespace cafhvd
