// The job actor: one lifecycle for static and elastic jobs.
//
//   hosts       a fixed list (-H, --hostfile, or `run`'s own machine) or a discovery
//               script run every interval; each host joins the same way: reachable ->
//               connected (mutual TLS) -> a colocator -> node info -> NIC -> ready
//   generation  ready hosts in age order -> get_host_assignments -> a plan (a value,
//               runtime/generation); slots of the plan without a process get one,
//               processes that run are never restarted
//   barrier     elastic, as horovodrun's driver: generation 1 is released at once and its
//               processes start with it. A later plan is released when every process it
//               carries over voted with GET /rank_and_size/<host>:<lr> (waited for up to
//               --elastic-timeout: they may be in a long step); its fresh slots start at
//               the release with the released plan in their environment and never vote
//               (a real Horovod worker's first hvd.init() reads its environment). Host
//               changes reach running ranks through rank 0's notification service
//               (Horovod's HostsUpdatedRequest) and /elastic/update. Static jobs have one
//               plan, released at once.
//   failure     static (fail fast): the first rank that fails, or a lost agent, stops
//               the job with that rank's code. Elastic: its host is blacklisted (with
//               cooldown if configured) and the next generation starts at once, as long
//               as a rank of the last released generation carries the state over.
//   end         the job ends when the final generation's ranks exit 0, or fails with
//               the first failure named; every stop is SIGTERM, grace, SIGKILL.
#include "actors/driver.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <utility>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <caf/openssl/all.hpp>

#include "actors/config.hpp"
#include "actors/driver_util.hpp"
#include "actors/node_actors.hpp"
#include "runtime/channel.hpp"
#include "runtime/env.hpp"
#include "runtime/event_log.hpp"
#include "runtime/generation.hpp"
#include "runtime/gpu.hpp"
#include "runtime/horovod_wire.hpp"
#include "runtime/nic.hpp"
#include "runtime/nic_probe.hpp"
#include "runtime/process.hpp"
#include "runtime/rendezvous_server.hpp"
#include "runtime/torch_store.hpp"

namespace cafhvd {

namespace {

using job_actor = driver_full_actor::extend<
    caf::reacts_to<discover_atom>,                    // time to run the script
    caf::reacts_to<discover_atom, bool, std::string>, // the script's output or error
    caf::reacts_to<vote_atom, std::string, int32_t>,  // GET /rank_and_size/<host>:<lr>
    caf::reacts_to<rejoin_atom, uint64_t>,            // ranks asked for a new generation
    // PUT /worker_addresses/<host>:<lr>: a Horovod worker's notification service (body)
    caf::reacts_to<register_atom, std::string, int32_t, std::string>,
    // rank 0 was told of generation G's host change: (G, slot, "" or why not)
    caf::reacts_to<notified_atom, uint64_t, std::string, std::string>,
    caf::reacts_to<retire_atom, uint32_t, int32_t>,   // signal a stopped slot's process
    // a discovered host resolved (its address) and reachable ("" = yes) or why not
    caf::reacts_to<probed_atom, std::string, std::string, std::string>>;

// deadline_atom kinds (low 4 bits; the rest is a serial number)
enum : uint32_t {
  dl_teardown = 1,
  dl_slots = 2,
  dl_barrier = 3,
  dl_start = 4,
  dl_owner = 5,   // executor: the owner's start frame
  dl_shutdown = 6 // executor: ranks end after their channel closed
};

using clock_type = std::chrono::steady_clock;

struct ehost {
  enum class status { connecting, ready, unusable, lost };
  host_spec spec; // from the latest discovery output that listed it
  std::string address;
  status st = status::connecting;
  bool listed = false;
  caf::node_id nid;
  colocator_actor colocator;
  node_info info;
  std::string reach_address;
  std::vector<std::string> nics;
  bool blacklisted = false;
  int failures = 0;
  std::optional<clock_type::time_point> cooldown_end;
  clock_type::time_point retry_at{};
  std::string last_warning;
  int planned = 0;            // static: ranks the job places here
  std::vector<int32_t> gpus;  // devices the node lent to the job
  int gpu_cap = -1;           // GPU jobs: the slots its lent devices allow
  bool has_info = false;      // static: node info is in (NIC discovery waits for all)
  uint32_t capped_warned = 0; // the listed slot count last warned about
  std::string endpoint() const { return spec.endpoint(); }
  std::string label() const {
    return info.name.empty() ? spec.endpoint() : fmt::format("{} ({})", info.name, endpoint());
  }
  int slots() const {
    int s = static_cast<int>(spec.slots);
    if (info.slots != 0)
      s = std::min(s, static_cast<int>(info.slots));
    if (gpu_cap >= 0)
      s = std::min(s, gpu_cap);
    return s;
  }
};

// One process of a slot. A slot (host, local rank) gets a new process when it rejoins the
// job after leaving it; the old one may still be ending, so processes are kept by id.
struct eslot {
  uint32_t id = 0;
  std::string key;      // slot_key(host, local rank), rank_and_size's key
  std::string endpoint; // its host
  worker_actor worker;
  bool running = false; // its process runs (or is being started)
  bool retired = false; // stopped or removed by us: its exit is not a failure
  uint64_t joined = 0;  // the last generation it was answered for
  int rank = -1;        // in the current plan, or the last one it had
  int exit_code = -1;
  bool launched = false;            // its process was started
  bool launching = false;           // its launch was asked for
  clock_type::time_point started{}; // when its process was asked for
  // executor mode
  std::deque<uint64_t> calls;  // sent to it and not answered yet
  std::string channel_problem; // how it broke its channel, if it did
  std::optional<std::string> boot_result;
};

class job : public job_actor::base {
public:
  job(caf::actor_config& cfg, job_config config, std::shared_ptr<job_result> result)
      : job_actor::base(cfg), job_(std::move(config)), elastic_(job_.elastic.has_value()),
        ec_(elastic_ ? *job_.elastic : fixed_policy(job_)), result_(std::move(result)),
        rng_(std::random_device{}()) {}

  behavior_type make_behavior() override {
    started_ = clock_type::now();
    job_id_ = make_job_id();
    set_down_handler([this](caf::down_msg& dm) { on_down(dm); });
    if (!job_.events_file.empty()) {
      try {
        events_ = event_log{job_.events_file};
      } catch (const std::exception& e) {
        say("warning: {}", e.what());
      }
    }
    if (job_.event_observer)
      events_.observe(job_.event_observer);
    nlohmann::json start{
        {"kind", elastic_ ? "elastic" : "static"}, {"command", job_.command}, {"np", job_.np}};
    if (elastic_) {
      start["discovery_script"] = ec_.discovery_script;
      start["min_np"] = ec_.min_np;
      start["max_np"] = ec_.max_np ? nlohmann::json(*ec_.max_np) : nlohmann::json();
    } else {
      std::vector<std::string> hs;
      for (auto& h : job_.hosts)
        hs.push_back(job_.embedded ? std::string{"localhost"} : h.endpoint());
      start["hosts"] = hs;
    }
    events_.emit("job.start", start);
    if (executor())
      open_control(); // the owner's start frame begins the job
    else
      begin();
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
        [this](discover_atom) { run_discovery(); },
        [this](discover_atom, bool ok, std::string& text) { on_discovered(ok, text); },
        [this](vote_atom, std::string& host, int32_t lr) { on_vote(host, lr); },
        [this](register_atom, std::string& host, int32_t lr, std::string& body) {
          on_register(host, lr, body);
        },
        [this](notified_atom, uint64_t g, std::string& slot, std::string& problem) {
          on_notified(g, slot, problem);
        },
        [this](rejoin_atom, uint64_t gen) { on_rejoin(gen); },
        [this](result_atom, uint32_t slot, uint64_t id, std::string& payload) {
          on_result(slot, id, std::move(payload));
        },
        [this](log_atom, uint32_t slot, std::string& payload) -> caf::result<caf::ok_atom> {
          return on_log(slot, std::move(payload));
        },
        [this](log_atom, uint64_t id) {
          if (auto it = log_acks_.find(id); it != log_acks_.end()) {
            it->second.deliver(caf::ok_atom::value);
            log_acks_.erase(it);
          }
        },
        [this](chanfail_atom, uint32_t slot, std::string& what) {
          if (auto* s = slot_by_id(slot)) {
            s->channel_problem = what;
            log("rank {} ({}) broke its executor channel: {}", s->rank, s->key, what);
          }
        },
        [this](control_atom, uint8_t kind, uint64_t id, uint32_t rank, uint32_t deadline,
               std::string& payload) { on_control(kind, id, rank, deadline, std::move(payload)); },
        [this](chanend_atom, std::string& problem) { on_owner_gone(problem); },
        [this](probed_atom, std::string& ep, std::string& address, std::string& problem) {
          if (auto it = hosts_.find(ep); it != hosts_.end() && !address.empty())
            it->second.address = address;
          on_reachable(ep, problem);
        },
        // A stop escalates: SIGTERM, then SIGKILL after the grace period.
        [this](retire_atom, uint32_t id, int32_t sig) {
          auto* s = slot_by_id(id);
          if (!s || !s->running || !s->retired || !s->worker)
            return;
          send(s->worker, terminate_atom::value, sig);
          if (sig == SIGTERM)
            delayed_send(this, job_.kill_grace, retire_atom::value, id, int32_t{SIGKILL});
        },
    };
  }

private:
  void begin() {
    if (elastic_) {
      send(this, discover_atom::value);
    } else {
      phase("connect");
      start_fixed_hosts();
    }
  }

  // -- executor mode --------------------------------------------------------------------
  // The owner (the program that drives the executor) sends start, calls and shutdown on
  // its channel; results, failures, logs, the rank table and the end go back. Payloads
  // are opaque; each call is relayed to its ranks' workers, which keep the order.

  bool executor() const { return job_.executor_fd >= 0; }

  void open_control() {
    auto hdl = caf::actor_cast<driver_full_actor>(this);
    control_ = std::make_unique<frame_channel>(
        job_.executor_fd, job_.max_frame,
        [hdl](frame&& f) {
          caf::anon_send(hdl, control_atom::value, static_cast<uint8_t>(f.kind), f.id, f.rank,
                         f.deadline_ms, std::move(f.payload));
        },
        [hdl](const std::string& problem) { caf::anon_send(hdl, chanend_atom::value, problem); });
    delayed_send(this, job_.start_timeout, deadline_atom::value, uint32_t{dl_owner});
  }

  void to_owner(frame_kind kind, uint64_t id, uint32_t rank, std::string payload,
                std::function<void()> done = {}) {
    if (!control_) {
      if (done)
        done();
      return;
    }
    frame f;
    f.kind = kind;
    f.id = id;
    f.rank = rank;
    f.payload = std::move(payload);
    control_->send(std::move(f), std::move(done));
  }

  void owner_broke(const std::string& what) { fail(fmt::format("the executor's owner {}", what)); }

  void on_control(uint8_t kind, uint64_t id, uint32_t rank, uint32_t deadline,
                  std::string payload) {
    switch (static_cast<frame_kind>(kind)) {
    case frame_kind::start:
      if (owner_started_)
        return owner_broke("sent a second start frame");
      owner_started_ = true;
      boot_ = std::move(payload);
      log("the executor's owner started the job (boot call: {} bytes)", boot_.size());
      return begin();
    case frame_kind::call:
      return on_call(id, rank, deadline, std::move(payload));
    case frame_kind::shutdown:
      return on_shutdown();
    default:
      return owner_broke(fmt::format("sent a {} frame (the owner may send start, call and "
                                     "shutdown)",
                                     frame_kind_name(kind)));
    }
  }

  // The slot that has rank `r` in the current plan.
  eslot* slot_of_rank(uint32_t r) {
    if (r >= gen_.plan.size())
      return nullptr;
    return current(slot_key(gen_.plan[r].hostname, gen_.plan[r].local_rank));
  }

  void on_call(uint64_t id, uint32_t rank, uint32_t deadline, std::string payload) {
    if (id <= last_call_) {
      return owner_broke(
          fmt::format("sent call {} after call {} (call ids must increase)", id, last_call_));
    }
    last_call_ = id;
    auto refuse = [&](uint32_t r, const std::string& why) {
      to_owner(frame_kind::failed, id, r, why);
    };
    if (elastic_)
      return refuse(rank, "an elastic executor runs only its start function; calls are for "
                          "static executors");
    if (done_ || shutdown_requested_)
      return refuse(rank, failure_ ? fmt::format("the worker group failed: {}", *failure_)
                                   : std::string{"the worker group is shutting down"});
    if (!all_started_)
      return refuse(rank, "the ranks are not all started yet (wait for the rank table)");
    if (rank != all_ranks && rank >= gen_.plan.size())
      return refuse(
          rank, fmt::format("there is no rank {}: the job has {} ranks", rank, gen_.plan.size()));
    uint32_t first = rank == all_ranks ? 0 : rank;
    uint32_t last = rank == all_ranks ? static_cast<uint32_t>(gen_.plan.size()) : rank + 1;
    for (uint32_t r = first; r < last; ++r) {
      auto* s = slot_of_rank(r);
      if (!s || !s->running || !s->worker) {
        refuse(r, fmt::format("rank {} is not running", r));
        continue;
      }
      s->calls.push_back(id);
      send(s->worker, call_atom::value, id, deadline, r + 1 == last ? std::move(payload) : payload);
    }
  }

  void on_result(uint32_t slot, uint64_t id, std::string payload) {
    auto* s = slot_by_id(slot);
    if (!s)
      return;
    if (auto it = std::find(s->calls.begin(), s->calls.end(), id); it != s->calls.end())
      s->calls.erase(it);
    if (id == 0 && elastic_) {
      // The start function's value: returned when the job ends, for its final ranks.
      s->boot_result = std::move(payload);
      return;
    }
    to_owner(frame_kind::result, id, static_cast<uint32_t>(s->rank), std::move(payload));
  }

  caf::result<caf::ok_atom> on_log(uint32_t slot, std::string payload) {
    auto* s = slot_by_id(slot);
    if (!s || !control_)
      return caf::ok_atom::value;
    auto id = next_log_ack_++;
    auto rp = make_response_promise<caf::ok_atom>();
    log_acks_.emplace(id, rp);
    auto hdl = caf::actor_cast<driver_full_actor>(this);
    // acknowledged once written to the owner: a rank cannot log faster than it reads
    to_owner(frame_kind::log, 0, static_cast<uint32_t>(s->rank), std::move(payload),
             [hdl, id] { caf::anon_send(hdl, log_atom::value, id); });
    return rp;
  }

  // Every call the slot has not answered fails with `cause`.
  void fail_calls(eslot& s, const std::string& cause) {
    for (auto id : s.calls)
      to_owner(frame_kind::failed, id, static_cast<uint32_t>(s.rank), cause);
    s.calls.clear();
  }

  // Why a slot's process is gone, for the calls it leaves unanswered.
  std::string loss_cause(const eslot& s, const std::string& how) {
    auto who = fmt::format("rank {} on host {}", s.rank, hosts_.at(s.endpoint).info.name);
    if (!s.channel_problem.empty())
      return fmt::format("{} broke its executor channel: {} (its process was killed: {})", who,
                         s.channel_problem, how);
    if (done_ && failure_ && !shutdown_requested_)
      return fmt::format("{} was stopped ({}) because the worker group failed: {}", who, how,
                         *failure_);
    return fmt::format("{} died: {}", who, how);
  }

  void send_rank_table() {
    nlohmann::json ranks = nlohmann::json::array();
    for (auto& row : gen_.plan)
      ranks.push_back({{"rank", row.rank},
                       {"host", row.hostname},
                       {"local_rank", row.local_rank},
                       {"local_size", row.local_size},
                       {"cross_rank", row.cross_rank},
                       {"cross_size", row.cross_size}});
    to_owner(
        frame_kind::ranks, gen_.number, 0,
        nlohmann::json{{"generation", gen_.number}, {"size", gen_.plan.size()}, {"ranks", ranks}}
            .dump());
  }

  // The owner asks for the end: every rank's channel closes (the process reads EOF and
  // exits 0); after the grace period the rest are stopped.
  void on_shutdown() {
    if (shutdown_requested_)
      return;
    shutdown_requested_ = true;
    log("the executor's owner asked for shutdown");
    if (done_)
      return maybe_finish();
    if (elastic_ || !all_started_) {
      // nothing to hand back: stop what runs
      interrupted_by_owner_ = true;
      teardown();
      return;
    }
    finishing_ = true;
    for (auto& [id, s] : slots_)
      if (s.running && s.worker)
        send(s.worker, close_atom::value);
    delayed_send(this, job_.kill_grace, deadline_atom::value, uint32_t{dl_shutdown});
    maybe_finish();
  }

  void on_owner_gone(const std::string& problem) {
    if (finished_)
      return;
    owner_gone_ = true;
    if (!problem.empty())
      say("the executor's owner broke its channel: {}", problem);
    if (done_)
      return;
    if (shutdown_requested_ && problem.empty())
      return; // shutting down already; nobody waits for the end frame
    failure_ = problem.empty() ? std::string{"the executor's owner closed its channel"}
                               : fmt::format("the executor's owner broke its channel: {}", problem);
    failure_said_ = true;
    say("{}; stopping the job", *failure_);
    teardown();
  }

  // At the end: nothing stays unanswered, an elastic start function's values come back
  // for the final generation's ranks, and the end frame is the last thing written.
  void end_for_owner(int code) {
    if (!control_)
      return;
    for (auto& [id, s] : slots_)
      fail_calls(s, fmt::format("the job ended before rank {} answered{}", s.rank,
                                failure_ ? ": " + *failure_ : std::string{}));
    if (elastic_ && code == 0 && !boot_.empty()) {
      for (uint32_t r = 0; r < gen_.plan.size(); ++r) {
        auto* s = slot_of_rank(r);
        if (s && s->boot_result)
          to_owner(frame_kind::result, 0, r, std::move(*s->boot_result));
        else
          to_owner(frame_kind::failed, 0, r,
                   fmt::format("rank {} of the final generation returned no value", r));
      }
    }
    to_owner(frame_kind::end, static_cast<uint64_t>(code), 0, failure_ ? *failure_ : std::string{});
    control_->close_after_writes();
    if (!owner_gone_ && !control_->flush(std::chrono::seconds(10)))
      say("warning: the executor's owner did not read the job's end within 10 s");
  }

  // -- helpers ------------------------------------------------------------------------

  long elapsed_ms() const {
    return static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - started_)
            .count());
  }

  template <class... Ts> void log(fmt::format_string<Ts...> f, Ts&&... xs) {
    if (job_.verbose)
      write_all(2, fmt::format("caf-hvd [{:>5} ms] job: {}\n", elapsed_ms(),
                               fmt::format(f, std::forward<Ts>(xs)...)));
  }

  // What users always see: generations, blacklisting, waiting.
  template <class... Ts> void say(fmt::format_string<Ts...> f, Ts&&... xs) {
    write_all(2, fmt::format("caf-hvd: {}\n", fmt::format(f, std::forward<Ts>(xs)...)));
  }

  std::string describe(const caf::error& e) { return system().render(e); }

  // Static jobs' phases in the event log: each ends when the next begins.
  void phase(const char* name) {
    auto now = clock_type::now();
    if (!phase_.empty()) {
      events_.emit("phase.end", {{"phase", phase_}});
      phase_ms_.emplace_back(phase_,
                             std::chrono::duration<double, std::milli>(now - phase_at_).count());
    }
    phase_ = name;
    phase_at_ = now;
    if (!phase_.empty())
      events_.emit("phase.begin", {{"phase", phase_}});
  }

  // The closing summary on stderr (--quiet turns it off): what ran where, how long each
  // part took, how every process ended, and why the job ended as it did.
  void summarize(int code) {
    if (job_.quiet)
      return;
    // every host that was ever ready, with how it ended where it did not last
    std::vector<std::string> used, black, names = used_hosts_;
    { // in the job's host order: -H, or the order discovery first listed them in
      std::vector<std::string> job_order;
      for (auto& ep : elastic_ ? ever_listed_ : order_)
        if (auto it = hosts_.find(ep); it != hosts_.end())
          job_order.push_back(it->second.info.name);
      std::stable_sort(names.begin(), names.end(), [&](auto& a, auto& b) {
        return std::find(job_order.begin(), job_order.end(), a)
               < std::find(job_order.begin(), job_order.end(), b);
      });
    }
    for (auto& name : names) {
      auto& end = host_end_.at(name);
      used.push_back(end.empty() ? name : fmt::format("{} {}", name, end));
    }
    for (auto& [ep, h] : hosts_)
      if (h.blacklisted)
        black.push_back(h.info.name.empty() ? ep : h.info.name);
    auto ends = process_ends_;
    for (auto& [id, s] : slots_)
      if (s.launching && s.exit_code < 0)
        ++ends["no exit seen"]; // still running, or lost with its host
    size_t processes = 0;
    for (auto& [what, n] : ends)
      processes += static_cast<size_t>(n);
    std::vector<std::string> end_text, phases;
    for (auto& [what, n] : ends)
      end_text.push_back(fmt::format("{} x {}", n, what));
    if (elastic_) {
      // an elastic job's time per generation: from its forming to the next one's
      for (size_t i = 0; i < gen_formed_.size(); ++i) {
        auto until = i + 1 < gen_formed_.size() ? gen_formed_[i + 1].second : clock_type::now();
        phases.push_back(fmt::format(
            "generation {} {:.1f}", gen_formed_[i].first,
            std::chrono::duration<double, std::milli>(until - gen_formed_[i].second).count()));
      }
    } else {
      for (auto& [p, ms] : phase_ms_)
        phases.push_back(fmt::format("{} {:.1f}", p, ms));
    }
    std::string text = fmt::format(
        "caf-hvd: summary: exit {}{}\n"
        "caf-hvd:   hosts        {} ({})\n"
        "caf-hvd:   processes    {} ({}); {} generation{}, the last of {} ranks\n"
        "caf-hvd:   time         {:.1f} ms{}\n",
        code,
        failure_       ? fmt::format(" ({})", *failure_)
        : interrupted_ ? " (interrupted)"
                       : "",
        used.size(), fmt::join(used, ", "), processes, fmt::join(end_text, ", "), gen_.number,
        gen_.number == 1 ? "" : "s", gen_.plan.size(), static_cast<double>(elapsed_ms()),
        phases.empty() ? std::string{} : fmt::format(" ({} ms)", fmt::join(phases, ", ")));
    if (!black.empty())
      text += fmt::format("caf-hvd:   blacklisted  {}\n", fmt::join(black, ", "));
    write_all(2, text);
  }

  eslot* slot_by_id(uint32_t id) {
    auto it = slots_.find(id);
    return it == slots_.end() ? nullptr : &it->second;
  }

  // The slot's latest process, if it ever had one.
  eslot* current(const std::string& key) {
    auto it = current_.find(key);
    return it == current_.end() ? nullptr : slot_by_id(it->second);
  }

  bool is_current(const eslot& s) const {
    auto it = current_.find(s.key);
    return it != current_.end() && it->second == s.id;
  }

  ehost* host_by_name(const std::string& name) {
    for (auto& [ep, h] : hosts_)
      if (h.info.name == name && h.st == ehost::status::ready)
        return &h;
    return nullptr;
  }

  bool in_plan(const std::string& key) const { return gen_.rows.count(key) > 0; }

  // -- discovery ----------------------------------------------------------------------

  void run_discovery() {
    // Without a script (tests on the test coordinator), discovery results arrive as
    // messages.
    if (done_ || discovering_ || ec_.discovery_script.empty())
      return;
    discovering_ = true;
    auto hdl = caf::actor_cast<job_actor>(this);
    std::thread{[hdl, shim = ec_.shim, path = ec_.discovery_script,
                 timeout = ec_.discovery_timeout] {
      auto r = run_discovery_script(shim, path, timeout);
      caf::anon_send(hdl, discover_atom::value, r.ok, r.ok ? r.output : r.error);
    }}.detach();
  }

  void on_discovered(bool ok, const std::string& text) {
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
      if (first)
        return fail(fmt::format("host discovery script {} failed on its first call: {}",
                                ec_.discovery_script, error));
      say("warning: host discovery script {} failed (keeping the last host set, trying again in "
          "{} s): {}",
          ec_.discovery_script, ec_.discovery_interval.count() / 1000.0, error);
      delayed_send(this, ec_.discovery_interval, discover_atom::value);
      return;
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
      h.listed = true;
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
    delayed_send(this, ec_.discovery_interval, discover_atom::value);
  }

  // -- joining hosts --------------------------------------------------------------------

  // Name resolution and a reachability check run on a thread (neither may block the
  // actor; CAF connects one node at a time, so a host that does not answer TCP would
  // stall every other connect).
  void connect_host(const std::string& ep) {
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
        caf::anon_send(hdl, probed_atom::value, ep, std::string{},
                       fmt::format("cannot resolve '{}': {}", host, error));
        return;
      }
      auto r = check_tcp_reachable({{*addr, port}}, std::chrono::milliseconds(3000));
      caf::anon_send(hdl, probed_atom::value, ep, *addr,
                     r.empty() || r.front().empty()
                         ? std::string{}
                         : fmt::format("cannot reach it: {}{}", r.front(),
                                       r.front() == std::strerror(ECONNREFUSED)
                                           ? " (is `caf-hvd node` running there?)"
                                           : ""));
    }}.detach();
  }

  // -- static jobs: the given hosts, all of them needed --------------------------------

  static elastic_config fixed_policy(const job_config& job) {
    elastic_config ec;
    ec.min_np = job.np;
    ec.max_np = job.np;
    ec.elastic_timeout = job.start_timeout;
    ec.reset_limit = 0;
    return ec;
  }

  // Ranks are placed over the given slots before anything connects, so hosts that get
  // no rank are never contacted; the start-up has one deadline (--start-timeout).
  void start_fixed_hosts() {
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
  std::string start_waits_for() {
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

  void on_reachable(const std::string& ep, const std::string& problem) {
    auto it = hosts_.find(ep);
    if (it == hosts_.end() || it->second.st != ehost::status::connecting || done_)
      return;
    if (!problem.empty())
      return host_unusable(ep, problem);
    connect_agent(ep);
  }

  // At most connect_window handshakes at once: CAF 0.17 runs every TLS handshake of this
  // process on its one multiplexer thread, so more in flight only starves the heartbeats
  // of the links already up (at 128 agents they timed out) without finishing sooner.
  static constexpr size_t connect_window = 8;

  void connect_agent(const std::string& ep) {
    connect_queue_.push_back(ep);
    pump_connects();
  }

  void pump_connects() {
    while (connects_in_flight_ < connect_window && !connect_queue_.empty()) {
      auto ep = connect_queue_.front();
      connect_queue_.pop_front();
      ++connects_in_flight_;
      dial(ep);
    }
  }

  void dialed() {
    --connects_in_flight_;
    pump_connects();
  }

  void dial(const std::string& ep) {
    auto& h = hosts_.at(ep);
    auto mm =
        job_.tls ? system().openssl_manager().actor_handle() : system().middleman().actor_handle();
    log("connecting to node agent {} ({})", ep, h.address);
    request(mm, job_.start_timeout, caf::connect_atom::value, h.address, h.spec.port)
        .then(
            [this, ep](caf::node_id& nid, caf::strong_actor_ptr&, std::set<std::string>&) {
              dialed();
              auto& h = hosts_.at(ep);
              for (auto& [other, o] : hosts_)
                if (other != ep && o.nid == nid && (o.st == ehost::status::ready || !elastic_))
                  return host_unusable(ep,
                                       fmt::format("it is the same node agent as {} (node id {})",
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

  std::string connect_error(const caf::error& e, const std::string& peer = {}) {
    return cafhvd::connect_error(system(), e, job_.tls, peer);
  }

  void spawn_colocator(const std::string& ep) {
    auto& h = hosts_.at(ep);
    auto self_hdl = caf::actor_cast<driver_actor>(this);
    auto grace = static_cast<int32_t>(job_.kill_grace.count());
    if (job_.embedded) {
      // By name from this system's factories, as a node agent spawns it for a remote
      // driver (tests put fake node actors behind the same names).
      auto c = system().spawn<colocator_actor>(colocator_type_name,
                                               caf::make_message(self_hdl, job_id_, grace));
      if (!c)
        return host_unusable(ep,
                             fmt::format("cannot start its colocator: {}", describe(c.error())));
      monitor(*c);
      h.colocator = *c;
      return query_host(ep);
    }
    auto mm = system().middleman().actor_handle();
    request(mm, job_.start_timeout, caf::spawn_atom::value, h.nid, std::string{colocator_type_name},
            caf::make_message(self_hdl, job_id_, grace), system().message_types<colocator_actor>())
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

  void query_host(const std::string& ep) {
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

  // -- GPUs -----------------------------------------------------------------------------
  // Each node lends devices to the job; they come back when the job's colocator there
  // ends (with the job's last rank on that node, also when the driver is gone).

  std::string gpu_shortage(const ehost& h, size_t need) {
    if (h.info.gpus.empty())
      return fmt::format("{} has no GPUs ({}; declare them with --gpus)", h.info.name,
                         h.info.gpu_source);
    return fmt::format("{} has {} free of {} (needs {} for {} slot{} x {})", h.info.name,
                       h.info.gpus_free.size(), h.info.gpus.size(), need, need / job_.gpus_per_slot,
                       need / job_.gpus_per_slot == 1 ? "" : "s", job_.gpus_per_slot);
  }

  // Static: every host must hold its ranks' devices before anything starts.
  void lend_fixed_gpus() {
    std::vector<std::string> short_hosts;
    for (auto& ep : listed_order_) {
      auto& h = hosts_.at(ep);
      auto need = static_cast<size_t>(h.planned) * job_.gpus_per_slot;
      if (h.info.gpus_free.size() < need)
        short_hosts.push_back(gpu_shortage(h, need));
    }
    if (!short_hosts.empty())
      return fail(fmt::format("not enough GPUs for {} rank{} with {} GPU{} per slot: {}", job_.np,
                              job_.np == 1 ? "" : "s", job_.gpus_per_slot,
                              job_.gpus_per_slot == 1 ? "" : "s", fmt::join(short_hosts, "; ")));
    for (auto& ep : listed_order_) {
      auto& h = hosts_.at(ep);
      auto need = static_cast<uint32_t>(h.planned) * job_.gpus_per_slot;
      request(h.colocator, job_.start_timeout, gpu_atom::value, need)
          .then(
              [this, ep, need](gpu_lease& lease) {
                auto& h = hosts_.at(ep);
                if (lease.devices.size() < need)
                  return fail(fmt::format("{} could not lend {} GPUs to the job: {}", h.label(),
                                          need, lease.why));
                h.gpus = std::move(lease.devices);
                log("{} lent GPUs [{}] to the job", h.label(), join_devices(h.gpus));
                for (auto& other : listed_order_)
                  if (hosts_.at(other).gpus.size()
                      < static_cast<size_t>(hosts_.at(other).planned) * job_.gpus_per_slot)
                    return;
                phase("nic");
                choose_fixed_nics();
              },
              [this, ep](caf::error& e) {
                host_unusable(ep, fmt::format("no GPUs lent: {}", describe(e)));
              });
    }
  }

  // Elastic: a host offers as many slots as its free devices allow (at most its listed
  // slots); it lends them when it joins and keeps them for the job.
  void lend_elastic_gpus(const std::string& ep) {
    auto& h = hosts_.at(ep);
    int fit = std::min(h.slots(), static_cast<int>(h.info.gpus_free.size() / job_.gpus_per_slot));
    if (fit <= 0)
      return host_unusable(
          ep, fmt::format("no free GPU for this job: {}", gpu_shortage(h, job_.gpus_per_slot)));
    auto need = static_cast<uint32_t>(fit) * job_.gpus_per_slot;
    request(h.colocator, job_.start_timeout, gpu_atom::value, need)
        .then(
            [this, ep, need](gpu_lease& lease) {
              auto it = hosts_.find(ep);
              if (it == hosts_.end())
                return;
              auto& h = it->second;
              if (lease.devices.size() < need)
                return host_unusable(ep, fmt::format("no GPUs lent: {}", lease.why));
              h.gpus = std::move(lease.devices);
              h.gpu_cap = static_cast<int>(h.gpus.size() / job_.gpus_per_slot);
              log("{} lent GPUs [{}] to the job ({} slots)", h.label(), join_devices(h.gpus),
                  h.gpu_cap);
              choose_nic(ep);
            },
            [this, ep](caf::error& e) {
              host_unusable(ep, fmt::format("no GPUs lent: {}", describe(e)));
            });
  }

  // The devices a rank sees: the job's devices on its node (shared; local rank i uses
  // the i-th group of gpus_per_slot) or only its own (per-rank).
  std::optional<std::string> visible_devices(const ehost& h, int local_rank) {
    if (job_.gpus_per_slot == 0)
      return std::nullopt;
    if (!job_.cuda_per_rank)
      return join_devices(h.gpus);
    auto g = static_cast<size_t>(job_.gpus_per_slot);
    auto first = static_cast<size_t>(local_rank) * g;
    if (first + g > h.gpus.size())
      return std::string{}; // cannot happen: placement is bounded by the devices
    return join_devices(std::vector<int32_t>(h.gpus.begin() + static_cast<long>(first),
                                             h.gpus.begin() + static_cast<long>(first + g)));
  }

  // Static jobs choose every host's interface at once, deterministically: all on this
  // machine -> loopback; one host -> the named interfaces or the one the driver reached
  // it through; otherwise every host probes every other host's candidate addresses from
  // each of its candidate interfaces, and each keeps those that reached all others.
  void choose_fixed_nics() {
    std::vector<ehost*> hs;
    for (auto& ep : listed_order_)
      hs.push_back(&hosts_.at(ep));
    size_t loopback = 0;
    for (auto* h : hs)
      if (job_.embedded || is_loopback_address(h->address))
        ++loopback;
    if (loopback != 0 && loopback != hs.size()) {
      std::vector<std::string> lo;
      for (auto* h : hs)
        if (is_loopback_address(h->address))
          lo.push_back(h->label());
      return fail(fmt::format("nodes {} were reached at a loopback address, which the job's other "
                              "hosts cannot reach; name them by an address of the shared network",
                              fmt::join(lo, ", ")));
    }
    if (loopback != 0) {
      for (auto* h : hs) {
        auto name = loopback_name(h->info);
        if (!job_.network_interfaces.empty()
            && std::find(job_.network_interfaces.begin(), job_.network_interfaces.end(), name)
                   == job_.network_interfaces.end())
          return fail(fmt::format("--network-interface: every node of this job is on this "
                                  "machine and talks over {}, which is not among the named "
                                  "interfaces",
                                  name));
        h->nics = {name};
        h->reach_address = "127.0.0.1";
      }
      return fixed_hosts_ready();
    }
    if (hs.size() == 1) {
      auto& h = *hs.front();
      h.reach_address = h.address;
      h.nics.clear();
      if (!job_.network_interfaces.empty()) {
        try {
          for (auto& a :
               candidate_interfaces({h.info.name, h.info.interfaces}, job_.network_interfaces))
            if (std::find(h.nics.begin(), h.nics.end(), a.name) == h.nics.end()) {
              if (h.nics.empty())
                h.reach_address = a.address;
              h.nics.push_back(a.name);
            }
        } catch (const std::exception& e) {
          return fail(fmt::format("NIC discovery: {}", e.what()));
        }
        return fixed_hosts_ready();
      }
      for (auto& a : h.info.interfaces)
        if (a.address == h.address)
          h.nics = {a.name};
      if (h.nics.empty())
        h.nics = {loopback_name(h.info)};
      return fixed_hosts_ready();
    }
    std::vector<host_interfaces> ifs;
    std::vector<std::vector<interface_addr>> candidates;
    for (auto* h : hs) {
      ifs.push_back({h->info.name, h->info.interfaces});
      try {
        candidates.push_back(candidate_interfaces(ifs.back(), job_.network_interfaces));
      } catch (const std::exception& e) {
        return fail(fmt::format("NIC discovery: {}", e.what()));
      }
    }
    auto results = std::make_shared<std::vector<std::vector<probe_result>>>(hs.size());
    auto left = std::make_shared<size_t>(hs.size());
    for (size_t i = 0; i < hs.size(); ++i) {
      std::vector<probe_target> targets;
      for (size_t j = 0; j < hs.size(); ++j)
        if (j != i)
          for (auto& a : candidates[j])
            targets.push_back({hs[j]->info.name, a.address, hs[j]->info.probe_port});
      auto ep = listed_order_[i];
      request(hs[i]->colocator, job_.start_timeout, probe_atom::value, std::move(targets),
              job_.network_interfaces)
          .then(
              [this, i, ep, results, left, ifs](std::vector<probe_result>& r) {
                for (auto& pr : r)
                  log("probe {} {} -> {} {}: {}", hosts_.at(ep).info.name, pr.iface, pr.host,
                      pr.address, pr.ok ? "ok" : pr.error);
                (*results)[i] = std::move(r);
                if (--*left > 0 || done_)
                  return;
                try {
                  for (auto& c : choose_interfaces(ifs, *results, job_.network_interfaces))
                    for (auto& e : listed_order_)
                      if (auto& h = hosts_.at(e); h.info.name == c.host) {
                        h.nics = c.usable;
                        h.reach_address = c.address;
                      }
                } catch (const std::exception& e) {
                  return fail(e.what());
                }
                fixed_hosts_ready();
              },
              [this, ep](caf::error& e) {
                fail(fmt::format("NIC probes of {}: {}", hosts_.at(ep).label(), describe(e)));
              });
    }
  }

  void fixed_hosts_ready() {
    for (auto& ep : listed_order_) {
      auto& h = hosts_.at(ep);
      log("{} uses {} (usable: {}), reached at {}", h.label(), h.nics.front(),
          fmt::join(h.nics, ","), h.reach_address);
    }
    for (auto& ep : listed_order_)
      if (!done_)
        host_ready(ep);
  }

  // Loopback agents talk over loopback. Otherwise a joining host probes every ready
  // host's candidate addresses from each of its candidate interfaces; it uses the
  // interfaces that reach all of them (the first one for Gloo).
  void choose_nic(const std::string& ep) {
    auto& h = hosts_.at(ep);
    if (is_loopback_address(h.address)) {
      h.nics = {loopback_name(h.info)};
      h.reach_address = "127.0.0.1";
      return host_ready(ep);
    }
    std::vector<interface_addr> mine;
    try {
      mine = candidate_interfaces(host_interfaces{h.info.name, h.info.interfaces},
                                  job_.network_interfaces);
    } catch (const std::exception& e) {
      return host_unusable(ep, fmt::format("NIC discovery: {}", e.what()));
    }
    std::vector<probe_target> targets;
    std::set<std::string> peers;
    for (auto& [other, o] : hosts_) {
      if (other == ep || o.st != ehost::status::ready || is_loopback_address(o.address))
        continue;
      peers.insert(o.info.name);
      if (o.reach_address.empty())
        continue;
      targets.push_back({o.info.name, o.reach_address, o.info.probe_port});
    }
    if (targets.empty()) {
      // The first host: the interface the driver reached it through.
      for (auto& a : mine)
        if (a.address == h.address)
          h.nics = {a.name};
      if (h.nics.empty() && !mine.empty())
        h.nics = {mine.front().name};
      if (h.nics.empty())
        return host_unusable(ep, "NIC discovery: no candidate interface");
      h.reach_address = h.address;
      for (auto& a : mine)
        if (a.name == h.nics.front())
          h.reach_address = a.address;
      return host_ready(ep);
    }
    request(h.colocator, job_.start_timeout, probe_atom::value, targets, job_.network_interfaces)
        .then(
            [this, ep, peers, mine](std::vector<probe_result>& results) {
              auto& h = hosts_.at(ep);
              std::map<std::string, std::set<std::string>> reached; // iface -> peers
              for (auto& r : results) {
                log("probe {} {} -> {} {}: {}", h.info.name, r.iface, r.host, r.address,
                    r.ok ? "ok" : r.error);
                if (r.ok)
                  reached[r.iface].insert(r.host);
              }
              h.nics.clear();
              for (auto& a : mine)
                if (reached[a.name].size() == peers.size()
                    && std::find(h.nics.begin(), h.nics.end(), a.name) == h.nics.end()) {
                  h.nics.push_back(a.name);
                  if (h.nics.size() == 1)
                    h.reach_address = a.address;
                }
              if (h.nics.empty())
                return host_unusable(
                    ep, fmt::format("NIC discovery: none of its interfaces reaches every host of "
                                    "the job ({})",
                                    fmt::join(peers, ", ")));
              host_ready(ep);
            },
            [this, ep](caf::error& e) {
              host_unusable(ep, fmt::format("NIC probes: {}", describe(e)));
            });
  }

  // A listed slot count above what the agent offers (`caf-hvd node --slots`) is capped.
  void warn_if_capped(ehost& h) {
    if (h.info.slots == 0 || h.spec.slots <= h.info.slots || h.capped_warned == h.spec.slots)
      return;
    h.capped_warned = h.spec.slots;
    say("warning: host {} is listed with {} slots but its agent offers {}; using {}", h.label(),
        h.spec.slots, h.info.slots, h.info.slots);
  }

  void host_ready(const std::string& ep) {
    auto& h = hosts_.at(ep);
    // The job's servers listen towards its first host: on loopback, remote hosts cannot
    // reach them; on the network, a host reached over loopback cannot be reached by the
    // others.
    if (server_ && is_loopback_address(h.address) != is_loopback_address(server_->address()))
      return host_unusable(
          ep, is_loopback_address(h.address)
                  ? std::string{"it was reached at a loopback address, which the job's other "
                                "hosts cannot reach; list it by an address of the shared network"}
                  : fmt::format("the job's hosts are on this machine (its servers listen on "
                                "{}), which a remote host cannot reach; list every host by an "
                                "address of the shared network",
                                server_->address()));
    h.st = ehost::status::ready;
    // The job's servers serve the job's hosts (every address their agents reported)
    // and the driver's own machine, no one else.
    std::vector<std::string> addresses{h.reach_address, h.address};
    for (auto& i : h.info.interfaces)
      addresses.push_back(i.address);
    allowlist_->add_host(h.info.name, addresses);
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
    if (!server_ && !start_server(h))
      return;
    reconsider();
  }

  void host_unusable(const std::string& ep, const std::string& why) {
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

  // The rendezvous server listens on the driver's address towards the first host.
  bool start_server(const ehost& h) {
    std::string bind = "127.0.0.1";
    if (!is_loopback_address(h.address)) {
      auto a = local_address_towards(h.address);
      if (!a) {
        fail(fmt::format("no local address routes to node {} ({})", h.label(), h.address));
        return false;
      }
      bind = *a;
    }
    try {
      rendezvous_options o;
      o.bind = bind;
      o.allowlist = allowlist_;
      o.on_refused = [](const std::string& what) {
        write_all(2, fmt::format("caf-hvd: warning: {}\n", what));
      };
      server_ = std::make_unique<rendezvous_server>(o);
    } catch (const std::exception& e) {
      fail(e.what());
      return false;
    }
    auto hdl = caf::actor_cast<job_actor>(this);
    if (elastic_) {
      server_->enable_elastic(
          [hdl](const std::string& host, int lr) {
            caf::anon_send(hdl, vote_atom::value, host, static_cast<int32_t>(lr));
          },
          [hdl](const std::string& host, int lr, const std::string& body) {
            caf::anon_send(hdl, register_atom::value, host, static_cast<int32_t>(lr), body);
          });
      server_->set_update(0, "generation 0\nchange none\n");
    }
    log("rendezvous server on {}:{}", bind, server_->port());
    events_.emit("rendezvous", {{"address", bind}, {"port", server_->port()}});
    // torch's store lives next to it for the whole job, so MASTER_ADDR/PORT outlive any
    // host; each released generation gets a fresh key space (torchrun starts a new store
    // for each restart).
    if (job_.torch_store != torch_store_mode::off) {
      try {
        torch_store_ = std::make_unique<torch_store_server>(
            bind, uint16_t{0},
            [hdl](const std::string& problem) {
              caf::anon_send(hdl, tstore_atom::value, "on the driver: " + problem);
            },
            torch_store_limits{}, allowlist_,
            [](const std::string& what) {
              write_all(2, fmt::format("caf-hvd: warning: {}\n", what));
            });
      } catch (const std::exception& e) {
        fail(e.what());
        return false;
      }
      log("torch store on {}:{}", bind, torch_store_->port());
      events_.emit("torch_store", {{"address", bind}, {"port", torch_store_->port()}});
    }
    return true;
  }

  // -- generations ----------------------------------------------------------------------

  // Decides whether the available hosts call for a (new) generation.
  void reconsider() {
    if (done_ || finishing_)
      return;
    if (!elastic_)
      return start_fixed_generation();
    // Hosts listed together join together, in the order listed (deterministic), unless a
    // failure makes the job wait: then the next generation forms from the hosts at hand.
    bool plan_broken = rejoin_due_;
    for (auto& [key, row] : gen_.rows) {
      auto* h = host_by_name(row.hostname);
      plan_broken = plan_broken || !h || h->blacklisted || !h->listed;
    }
    if (!plan_broken)
      for (auto& [ep, h] : hosts_)
        if (h.listed && !h.blacklisted && h.st == ehost::status::connecting)
          return;
    std::vector<std::string> available;
    for (auto& ep : listed_order_) {
      auto it = hosts_.find(ep);
      if (it != hosts_.end() && it->second.st == ehost::status::ready && !it->second.blacklisted
          && it->second.listed)
        available.push_back(ep);
    }
    order_ = order_hosts(order_, available);
    std::vector<host_slots> hs;
    int total = 0;
    for (auto& ep : order_) {
      auto& h = hosts_.at(ep);
      hs.push_back({h.info.name, h.slots()});
      total += h.slots();
    }
    if (gen_.number > 0 && !previous_generation_survives()) {
      bool all_black =
          std::all_of(hosts_.begin(), hosts_.end(), [](auto& p) { return p.second.blacklisted; });
      auto first = first_failure_ ? "; first failure: " + *first_failure_ : std::string{};
      if (all_black)
        return fail(fmt::format("every host is blacklisted; first failure: {}",
                                first_failure_.value_or("none")));
      if (released_gen_ == 0)
        return fail(fmt::format("no host of generation {} is left to carry the job's state "
                                "over{}",
                                gen_.number, first));
      return fail(fmt::format("no host of generation {} is left to carry the job's state over: "
                              "the training state was lost with the last host of the previous "
                              "generation ({}){}",
                              released_gen_, fmt::join(released_hosts(), ","), first));
    }
    if (total < ec_.min_np) {
      wait_for_slots(total);
      return;
    }
    std::vector<slot_info> plan;
    try {
      plan = get_host_assignments(hs, ec_.min_np, ec_.max_np);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    waiting_slots_ = false;
    if (gen_.number > 0 && plan == gen_.plan && !rejoin_due_)
      return; // e.g. hosts beyond --max-np appeared: no reset
    if (gen_.number > 0 && ec_.reset_limit && static_cast<int>(gen_.number - 1) >= *ec_.reset_limit)
      return fail(
          fmt::format("the job has been reset {} times, which reaches the reset limit "
                      "(--reset-limit {}); stopping{}",
                      gen_.number - 1, *ec_.reset_limit,
                      first_failure_ ? " (last failure: " + *last_failure_ + ")" : std::string{}));
    begin_generation(std::move(plan), hs);
  }

  // "The previous generation" is the last released one, the only one whose ranks hold
  // training state: one of its ranks must run on a host of the next plan. Before any
  // release, a host of the forming generation must stay (nothing to carry yet, but a
  // program that never votes keeps its ranks only that way).
  // A static job has one generation, over every given host once all are ready.
  void start_fixed_generation() {
    if (gen_.number > 0)
      return;
    std::vector<host_slots> hs;
    for (auto& ep : listed_order_) {
      auto& h = hosts_.at(ep);
      if (h.st != ehost::status::ready)
        return;
      hs.push_back({h.info.name, h.planned});
    }
    order_ = listed_order_;
    std::vector<slot_info> plan;
    try {
      plan = get_host_assignments(hs, job_.np, job_.np);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    begin_generation(std::move(plan), hs);
  }

  bool previous_generation_survives() const {
    std::set<std::string> available;
    for (auto& ep : order_)
      available.insert(hosts_.at(ep).info.name);
    if (released_gen_ == 0) {
      for (auto& s : gen_.plan)
        if (available.count(s.hostname))
          return true;
      return gen_.plan.empty();
    }
    std::vector<slot_process> procs;
    for (auto& [id, s] : slots_)
      procs.push_back(process_of(s));
    return !state_carriers(released_gen_, procs, available).empty();
  }

  slot_process process_of(const eslot& s) const {
    auto& h = hosts_.at(s.endpoint);
    return {s.key, h.info.name, s.started, s.joined, s.running && !s.retired};
  }

  void wait_for_slots(int total) {
    if (!waiting_slots_) {
      waiting_slots_ = true;
      ++slot_wait_serial_;
      say("waiting up to {} s for at least {} slots (--min-np); available now: {}",
          ec_.elastic_timeout.count() / 1000.0, ec_.min_np, available_text(total));
      delayed_send(this, ec_.elastic_timeout, deadline_atom::value,
                   dl_slots | (slot_wait_serial_ << 4));
    }
  }

  std::string available_text(int total) {
    std::string hosts;
    for (auto& ep : order_) {
      auto& h = hosts_.at(ep);
      hosts += fmt::format("{}{} ({} slots)", hosts.empty() ? "" : ", ", h.info.name, h.slots());
    }
    return fmt::format("{} slots{}", total, hosts.empty() ? "" : " on " + hosts);
  }

  void begin_generation(std::vector<slot_info> plan, const std::vector<host_slots>& hs) {
    auto change = gen_.number == 0 ? host_change::added : compare_hosts(plan_hosts_, hs);
    std::vector<std::string> added, removed;
    {
      std::set<std::string> before, after;
      for (auto& h : plan_hosts_)
        before.insert(h.hostname);
      for (auto& h : hs)
        after.insert(h.hostname);
      for (auto& h : hs)
        if (!before.count(h.hostname))
          added.push_back(h.hostname);
      for (auto& h : plan_hosts_)
        if (!after.count(h.hostname))
          removed.push_back(h.hostname);
    }
    rejoin_wanted_ = false;
    rejoin_due_ = false;
    auto reason = std::exchange(reset_reason_, std::string{});
    auto old_votes = std::move(gen_.votes);
    gen_ = generation{gen_.number + 1, std::move(plan), clock_type::now()};
    auto plan_host_names = gen_.hosts();
    plan_hosts_.clear();
    for (auto& h : hs)
      if (std::count(plan_host_names.begin(), plan_host_names.end(), h.hostname))
        plan_hosts_.push_back(h);
    // Votes that wait for this generation carry over; slots that left are told so.
    for (auto& key : old_votes) {
      if (in_plan(key))
        gen_.votes.insert(key);
      else
        retire_slot(key);
    }
    // Running slots that are no longer in the job will be answered -1 and are stopped
    // if they do not end by themselves.
    for (auto& [id, s] : slots_)
      if (s.running && !s.retired && !in_plan(s.key))
        retire_slot(s.key);
    std::string text = fmt::format("generation {}\nchange {}\n", gen_.number, to_string(change));
    for (auto& h : added)
      text += "added " + h + "\n";
    for (auto& h : removed)
      text += "removed " + h + "\n";
    std::string layout;
    for (auto& h : plan_hosts_)
      layout += fmt::format("{}{}:{}", layout.empty() ? "" : ",", h.hostname,
                            std::count_if(gen_.plan.begin(), gen_.plan.end(),
                                          [&](auto& s) { return s.hostname == h.hostname; }));
    link_rank_outputs();
    gen_formed_.emplace_back(gen_.number, clock_type::now());
    for (auto& r : removed)
      if (auto it = host_end_.find(r); it != host_end_.end() && it->second.empty())
        it->second = "removed";
    if (!elastic_)
      phase("launch");
    if (events_.enabled()) { // per-rank contexts are built only for a log that is written
      nlohmann::json plan = nlohmann::json::array();
      for (auto& row : gen_.plan)
        plan.push_back(
            {{"rank", row.rank}, {"host", row.hostname}, {"local_rank", row.local_rank}});
      events_.emit("generation.begin", {{"generation", gen_.number},
                                        {"size", gen_.plan.size()},
                                        {"hosts", gen_.hosts()},
                                        {"added", added},
                                        {"removed", removed},
                                        {"reason", reason},
                                        {"plan", plan}});
    }
    if (elastic_) {
      server_->set_update(gen_.number, text);
      say("generation {}: {} ranks on {}{}{}{}", gen_.number, gen_.plan.size(), layout,
          added.empty() || gen_.number == 1 ? ""
                                            : fmt::format(" (added {})", fmt::join(added, ",")),
          removed.empty() ? "" : fmt::format(" (removed {})", fmt::join(removed, ",")),
          added.empty() && removed.empty() && !reason.empty() ? " (" + reason + ")"
                                                              : std::string{});
    } else {
      log("{} ranks on {}", gen_.plan.size(), layout);
    }
    // Processes that run carry over and learn their place through rank_and_size; the
    // other slots are fresh: their processes start when the plan is released. A worker
    // spawned for an earlier plan whose process has not been asked for yet is fresh too.
    std::map<std::string, std::vector<std::pair<std::string, slot_info>>> fresh; // by host
    std::vector<std::string> host_order;
    for (size_t r = 0; r < gen_.plan.size() && !done_; ++r) {
      auto& row = gen_.plan[r];
      auto key = slot_key(row.hostname, row.local_rank);
      auto* s = current(key);
      if (s && s->running && !s->retired) {
        s->rank = row.rank;
        if (!s->launching)
          gen_.fresh.insert(key);
        continue;
      }
      gen_.fresh.insert(key);
      if (!fresh.count(row.hostname))
        host_order.push_back(row.hostname);
      fresh[row.hostname].emplace_back(key, row);
    }
    // No barrier for the first plan (Horovod's static rendezvous, and horovodrun's first
    // elastic generation): it is the job's from the start.
    if (!elastic_ || gen_.number == 1)
      release_generation();
    // Workers of fresh slots are spawned now; their processes wait for the release.
    for (auto& host : host_order)
      if (!done_)
        start_slots(host, fresh[host]);
    barrier_check_.reset();
    if (!torch_store_)
      find_master_port();
    if (!elastic_ || gen_.released)
      return;
    if (reason.empty())
      notify_running_ranks(change);
    schedule_barrier_check();
    check_release();
  }

  // One host's new slots: one request spawns their workers (the node's colocator does
  // it locally), one request launches them. Messages per job grow with hosts, not ranks.
  void start_slots(const std::string& hostname,
                   const std::vector<std::pair<std::string, slot_info>>& rows) {
    auto* h = host_by_name(hostname);
    if (!h)
      return fail(fmt::format("internal error: host {} of the plan is not ready", hostname));
    std::vector<uint32_t> ids;
    for (auto& [key, row] : rows) {
      eslot s;
      s.id = next_slot_id_++;
      s.key = key;
      s.endpoint = h->endpoint();
      s.running = true;
      s.rank = row.rank;
      s.started = clock_type::now();
      // A retired process of the same slot may still be ending: it keeps its own entry.
      slots_[s.id] = s;
      current_[key] = s.id;
      ids.push_back(s.id);
    }
    auto ep = h->endpoint();
    request(h->colocator, job_.start_timeout, workers_atom::value, ids)
        .then(
            [this, ep, ids](std::vector<worker_actor>& workers) {
              std::vector<uint32_t> ready;
              for (size_t i = 0; i < ids.size(); ++i)
                if (worker_spawned(ids[i], i < workers.size() ? workers[i] : worker_actor{}))
                  ready.push_back(ids[i]);
              launch_slots(ep, ready);
            },
            [this, ids](caf::error& e) {
              fail_running(ids, fmt::format("cannot start its worker: {}", describe(e)));
            });
  }

  // A batch request for these slots failed: each still running fails with `why`.
  void fail_running(const std::vector<uint32_t>& ids, const std::string& why) {
    for (auto id : ids)
      if (auto* s = slot_by_id(id); s && s->running)
        slot_failed(*s, why);
  }

  // True when the slot's worker may launch its process now.
  bool worker_spawned(uint32_t id, worker_actor w) {
    auto* s = slot_by_id(id);
    if (!s)
      return false;
    if (!w) {
      slot_failed(*s, "its node could not spawn its worker");
      return false;
    }
    monitor(w);
    s->worker = w;
    if (s->retired || done_) {
      s->running = false;
      demonitor(w.address()); // its end is ours, not news of its node
      send_exit(w, caf::exit_reason::user_shutdown);
      return false;
    }
    return true;
  }

  // --torch-store off: MASTER_PORT is a port free on rank 0's host now, found anew for
  // every generation (rank 0 and its host may have changed); new processes wait for it.
  void find_master_port() {
    master_port_ = 0;
    auto g = gen_.number;
    auto host = gen_.plan.front().hostname;
    auto* m = host_by_name(host);
    if (!m)
      return fail(fmt::format("internal error: rank 0's host {} is not ready", host));
    request(m->colocator, job_.start_timeout, port_atom::value)
        .then(
            [this, g, host](int32_t port) {
              if (g != gen_.number || done_)
                return;
              if (port <= 0)
                return fail(
                    fmt::format("rank 0's host {} found no free port for MASTER_PORT", host));
              master_port_ = port;
              std::map<std::string, std::vector<uint32_t>> by_host;
              for (auto id : std::exchange(awaiting_port_, {}))
                if (auto* s = slot_by_id(id); s && s->running && !s->retired && s->worker)
                  by_host[s->endpoint].push_back(id);
              for (auto& [ep, ids] : by_host)
                launch_slots(ep, ids);
            },
            [this, g, host](caf::error& e) {
              if (g == gen_.number)
                fail(fmt::format("MASTER_PORT: rank 0's host {} did not answer: {}", host,
                                 describe(e)));
            });
  }

  // The slot's environment from its row of the current plan (which may be newer than
  // the one its worker was spawned for); nullopt when it cannot launch now.
  std::optional<std::vector<std::string>> rank_environment(eslot& s) {
    auto it = gen_.rows.find(s.key);
    if (it == gen_.rows.end()) {
      // The slot left the job while its worker was spawned.
      s.running = false;
      s.retired = true;
      demonitor(s.worker.address());
      send_exit(s.worker, caf::exit_reason::user_shutdown);
      return std::nullopt;
    }
    if (!gen_.released) {
      // A process reads its place from its environment: it starts with the released plan
      // and never writes into the rendezvous scopes of a plan it will not run in.
      awaiting_release_.push_back(s.id);
      return std::nullopt;
    }
    auto& row = it->second;
    auto& h = hosts_.at(s.endpoint);
    auto* master_host = host_by_name(gen_.plan.front().hostname);
    if (!master_host) {
      slot_failed(s, "rank 0's host is gone");
      return std::nullopt;
    }
    auto& master = *master_host;
    if (!torch_store_ && master_port_ <= 0) {
      awaiting_port_.push_back(s.id); // launched when this generation's port is known
      return std::nullopt;
    }
    rank_env_input in;
    in.rank = row.rank;
    in.size = row.size;
    in.local_rank = row.local_rank;
    in.local_size = row.local_size;
    in.cross_rank = row.cross_rank;
    in.cross_size = row.cross_size;
    in.group_rank =
        static_cast<int>(std::find_if(plan_hosts_.begin(), plan_hosts_.end(),
                                      [&](auto& x) { return x.hostname == row.hostname; })
                         - plan_hosts_.begin());
    in.hostname = h.info.name;
    if (torch_store_) {
      in.master_addr = server_->address();
      in.master_port = torch_store_->port();
      in.agent_store = true;
      in.restart_count = static_cast<int>(gen_.number - 1);
    } else {
      in.master_addr = master.reach_address;
      in.master_port = master_port_;
    }
    in.nccl_ifaces = h.nics;
    in.iface = h.nics.empty() ? std::string{} : h.nics.front();
    in.rendezvous_addr = server_->address();
    in.rendezvous_port = server_->port();
    in.base = job_.base_env;
    in.extra = job_.extra_env;
    in.cuda_visible_devices = visible_devices(h, row.local_rank);
    in.cpus_per_slot = static_cast<int>(job_.cpus_per_slot);
    if (elastic_) {
      in.extra.push_back("HOROVOD_ELASTIC=1");
      // the released plan it starts in: /elastic/update says when a newer one forms
      in.extra.push_back(fmt::format("CAF_HVD_GENERATION={}", gen_.number));
    }
    auto env = build_rank_env(in);
    env.push_back("PWD=" + job_.cwd);
    std::sort(env.begin(), env.end());
    return env;
  }

  // Launches the slots (all of host `ep`, workers spawned) with one message: the
  // variables they share once, each slot's own beside them.
  void launch_slots(const std::string& ep, const std::vector<uint32_t>& ids) {
    auto hit = hosts_.find(ep);
    if (hit == hosts_.end() || !hit->second.colocator)
      return;
    launch_batch batch;
    std::vector<std::vector<std::string>> envs;
    for (auto id : ids) {
      auto* s = slot_by_id(id);
      if (!s || !s->running || s->retired || !s->worker)
        continue;
      auto env = rank_environment(*s);
      if (!env)
        continue;
      batch.slots.push_back(id);
      envs.push_back(std::move(*env));
      s->launching = true;
      if (elastic_)
        s->joined = gen_.number; // it starts in the released plan: it takes the state
      if (executor() && !boot_.empty())
        s->calls.push_back(0);
      open_outputs(s->key);
    }
    if (batch.slots.empty())
      return;
    batch.common_env = envs.front();
    for (size_t i = 1; i < envs.size(); ++i) {
      std::vector<std::string> both;
      std::set_intersection(batch.common_env.begin(), batch.common_env.end(), envs[i].begin(),
                            envs[i].end(), std::back_inserter(both));
      batch.common_env.swap(both);
    }
    for (auto& env : envs) {
      std::vector<std::string> own;
      std::set_difference(env.begin(), env.end(), batch.common_env.begin(), batch.common_env.end(),
                          std::back_inserter(own));
      batch.envs.push_back(std::move(own));
    }
    batch.argv = job_.command;
    batch.cwd = job_.cwd;
    if (executor()) {
      batch.executor = true;
      batch.boot = boot_;
      batch.max_frame = job_.max_frame;
    }
    auto launched = batch.slots;
    request(hit->second.colocator, job_.start_timeout, launch_atom::value, std::move(batch))
        .then(
            [this, launched](std::vector<int32_t>& pids) {
              for (size_t i = 0; i < launched.size(); ++i)
                if (i < pids.size() && pids[i] > 0)
                  slot_launched(launched[i], pids[i]);
              // pid 0: the process could not start; its worker reports how it ended
            },
            [this, launched](caf::error& e) {
              fail_running(launched, fmt::format("launch failed: {}", describe(e)));
            });
  }

  void slot_launched(uint32_t id, int32_t pid) {
    auto* s = slot_by_id(id);
    if (!s)
      return;
    s->launched = true;
    log("rank {} ({}) started, pid {}", s->rank, s->key, pid);
    if (events_.enabled())
      events_.emit("rank.started", {{"rank", s->rank},
                                    {"host", hosts_.at(s->endpoint).info.name},
                                    {"slot", s->key},
                                    {"pid", pid},
                                    {"generation", gen_.number}});
    // A static job launches each slot of its one generation once.
    if (!elastic_ && !all_started_ && ++launched_ == gen_.plan.size()) {
      all_started_ = true;
      log("all {} ranks started", gen_.plan.size());
      // A rank may have failed while another host's launch reply was on its way: the
      // job is in teardown then, and stays there.
      if (done_)
        return;
      phase("run");
      if (executor())
        send_rank_table();
    }
  }

  // A slot that will not take part any more: its held votes are answered and its
  // process, if it does not end by itself, is stopped after the grace period.
  void retire_slot(const std::string& key) {
    if (server_)
      server_->answer_slot(key, slot_not_in_job);
    gen_.votes.erase(key);
    auto* s = current(key);
    if (!s || s->retired || drop_if_unlaunched(*s))
      return;
    s->retired = true;
    if (s->running)
      delayed_send(this, job_.kill_grace, retire_atom::value, s->id, int32_t{SIGTERM});
  }

  // -- the barrier ------------------------------------------------------------------------

  void on_vote(const std::string& host, int32_t lr) {
    auto key = slot_key(host, lr);
    if (done_ || finishing_) {
      server_->answer_slot(key, slot_not_in_job);
      return;
    }
    auto* s = current(key);
    if (!in_plan(key) || !s || s->retired || !s->launching) {
      // (a slot without a process cannot vote: its process starts with the release)
      log("vote of {} which is not in generation {}: answered -1", key, gen_.number);
      server_->answer_slot(key, slot_not_in_job);
      return;
    }
    if (s->joined < gen_.number) {
      if (gen_.votes.insert(key).second)
        log("vote of {} for generation {} ({} of {})", key, gen_.number, gen_.votes.size(),
            gen_.plan.size());
      if (!gen_.first_vote) {
        gen_.first_vote = clock_type::now(); // from now on its fresh peers have deadlines
        schedule_barrier_check();
      }
      return check_release();
    }
    // It already joined this generation: it asks for the next one (it saw a failure).
    gen_.votes.insert(key);
    if (!rejoin_wanted_) {
      rejoin_wanted_ = true;
      log("{} asks for a new generation; waiting briefly for the failure's report", key);
      delayed_send(this, std::chrono::milliseconds(1000), rejoin_atom::value, gen_.number);
    }
  }

  // No failure explains a rank's request for a new generation: start one anyway.
  void on_rejoin(uint64_t gen) {
    if (gen != gen_.number || !rejoin_wanted_ || done_ || finishing_)
      return;
    say("ranks asked to re-join without a reported failure; starting a new generation");
    rejoin_due_ = true;
    reset_reason_ = "ranks asked to re-join";
    reconsider();
  }

  // The join deadline of a slot of the forming generation that has not voted yet.
  join_deadline deadline_of(const std::string& key) {
    auto* s = current(key);
    return s ? deadline_for(gen_, process_of(*s), job_.start_timeout, ec_.elastic_timeout)
             : join_deadline{};
  }

  // Arms one check for the earliest join deadline of the forming generation (fresh
  // processes: --start-timeout; processes that hold state: --elastic-timeout).
  void schedule_barrier_check() {
    if (gen_.released || done_)
      return;
    std::optional<clock_type::time_point> next;
    for (auto& key : gen_.missing())
      if (auto d = deadline_of(key); d.kind != deadline_kind::none && (!next || d.at < *next))
        next = d.at;
    if (!next || (barrier_check_ && *barrier_check_ <= *next))
      return;
    barrier_check_ = next;
    auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(*next - clock_type::now());
    delayed_send(this, std::max(delay, std::chrono::milliseconds(0)) + std::chrono::milliseconds(1),
                 deadline_atom::value, dl_barrier | static_cast<uint32_t>(gen_.number << 4));
  }

  // Slots whose join deadline passed are failures (their hosts are blacklisted); the
  // message says which deadline and why it applies.
  void on_barrier_deadline() {
    barrier_check_.reset();
    auto now = clock_type::now();
    std::vector<std::string> fresh, carrying;
    std::set<std::string> bad_hosts;
    for (auto& key : gen_.missing()) {
      auto d = deadline_of(key);
      if (d.kind == deadline_kind::none || now < d.at)
        continue;
      auto name = fmt::format("rank {} ({})", gen_.rows.at(key).rank, key);
      (d.kind == deadline_kind::fresh ? fresh : carrying).push_back(name);
      bad_hosts.insert(current(key)->endpoint);
    }
    if (bad_hosts.empty())
      return schedule_barrier_check();
    std::vector<std::string> what;
    if (!fresh.empty())
      what.push_back(fmt::format("{} did not join generation {} within {} s (--start-timeout; "
                                 "does the program call rank_and_size, e.g. through an elastic "
                                 "run loop?)",
                                 fmt::join(fresh, ", "), gen_.number,
                                 job_.start_timeout.count() / 1000.0));
    if (!carrying.empty())
      what.push_back(fmt::format("{} did not join generation {} within {} s (--elastic-timeout; "
                                 "it holds the state of generation {} and was waited for while "
                                 "it ran)",
                                 fmt::join(carrying, ", "), gen_.number,
                                 ec_.elastic_timeout.count() / 1000.0, released_gen_));
    for (auto& w : what) {
      note_failure(w);
      say("{}", w);
    }
    for (auto& ep : bad_hosts)
      blacklist(ep);
    reconsider();
  }

  void check_release() {
    if (gen_.released || done_ || finishing_ || !gen_.complete() || aborts_in_flight_ > 0)
      return; // (the broken generation's Gloo connections are still being shut down)
    log("generation {}: all {} ranks it carries over joined", gen_.number,
        gen_.plan.size() - gen_.fresh.size());
    release_generation();
    // The fresh slots' processes start now, with the released plan.
    std::map<std::string, std::vector<uint32_t>> by_host;
    for (auto id : std::exchange(awaiting_release_, {}))
      if (auto* s = slot_by_id(id); s && s->running && !s->retired && s->worker && !s->launching)
        by_host[s->endpoint].push_back(id);
    for (auto& [ep, ids] : by_host)
      launch_slots(ep, ids);
  }

  // The plan becomes the job's: the store serves its scopes, held votes are answered.
  void release_generation() {
    gen_.released = true;
    for (auto& key : gen_.votes)
      if (auto* s = current(key))
        s->joined = gen_.number;
    gen_.votes.clear();
    if (elastic_ && torch_store_ && gen_.number > 1)
      torch_store_->clear(); // before anyone learns its rank in the new plan
    released_gen_ = gen_.number;
    released_plan_ = gen_.plan;
    if (elastic_)
      server_->release(gen_.plan);
    else
      server_->init(gen_.plan);
    events_.emit("generation.released", {{"generation", gen_.number}});
    if (elastic_)
      log("generation {} released: {} ranks, {} of them fresh", gen_.number, gen_.plan.size(),
          gen_.fresh.size());
    if (executor() && elastic_)
      send_rank_table();
  }

  // Elastic: drops the slots whose processes were never asked for (they wait for a
  // release that will not come): nothing of theirs runs, so nothing reports their end.
  // (A static job launches every slot of its one plan.)
  void drop_unlaunched() {
    for (auto& [id, s] : slots_)
      drop_if_unlaunched(s);
    awaiting_release_.clear();
  }

  bool drop_if_unlaunched(eslot& s) {
    if (!elastic_ || !s.running || s.launching || s.launched)
      return false;
    s.running = false;
    s.retired = true;
    if (s.worker) {
      demonitor(s.worker.address()); // its end is ours, not news of its node
      send_exit(s.worker, caf::exit_reason::user_shutdown);
    }
    return true;
  }

  // -- Horovod's worker notification service ------------------------------------------
  // Running Horovod workers learn that hosts were added or removed only from a
  // HostsUpdatedRequest to rank 0's notification service (rank 0 spreads it at its next
  // commit; every rank then re-joins through rank_and_size). Each worker registers its
  // service with PUT /worker_addresses/<host>:<lr>: an unauthenticated pickle, decoded
  // by a decoder that accepts only (addresses, key). The key is never logged.

  void on_register(const std::string& host, int32_t lr, const std::string& body) {
    auto key = slot_key(host, lr);
    auto reg = decode_worker_registration(body);
    if (!reg.value) {
      say("warning: refused the notification service registration of {}: {}", key, reg.error);
      events_.emit("notify.refused", {{"slot", key}, {"cause", reg.error}});
      return;
    }
    auto where = to_string(*reg.value);
    log("{} registered its notification service at {}", key, where);
    events_.emit("notify.registered", {{"slot", key}, {"addresses", where}});
    registrations_[key] = std::move(*reg.value);
    if (notify_pending_ == gen_.number && !gen_.released && key == released_rank0())
      send_notification();
  }

  // Host names of the last released plan, in rank order.
  std::vector<std::string> released_hosts() const {
    std::vector<std::string> out;
    for (auto& row : released_plan_)
      if (std::find(out.begin(), out.end(), row.hostname) == out.end())
        out.push_back(row.hostname);
    return out;
  }

  // The slot of rank 0 of the last released plan ("" if none).
  std::string released_rank0() const {
    for (auto& row : released_plan_)
      if (row.rank == 0)
        return slot_key(row.hostname, row.local_rank);
    return {};
  }

  // The forming generation changes the hosts of running ranks that saw no failure.
  void notify_running_ranks(host_change change) {
    notify_pending_ = gen_.number;
    notify_change_ = change;
    send_notification();
  }

  void send_notification() {
    auto key = released_rank0();
    auto* s = key.empty() ? nullptr : current(key);
    if (!s || !s->running || !s->launched)
      return; // rank 0 is gone: its peers see that for themselves
    auto it = registrations_.find(key);
    if (it == registrations_.end()) {
      // Sent when it registers (a Horovod worker does so in hvd.elastic.run).
      log("rank 0 ({}) has no notification service yet; running ranks learn of generation {} "
          "through /elastic/update, or when it registers",
          key, gen_.number);
      return;
    }
    notify_pending_ = 0;
    // Horovod's workers keep only updates newer than the last one (whole seconds).
    auto now = std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    last_notify_ts_ = std::max<int64_t>(now, last_notify_ts_ + 1);
    auto hdl = caf::actor_cast<job_actor>(this);
    std::thread{[hdl, reg = it->second, ts = last_notify_ts_, res = static_cast<unsigned>(notify_change_),
                 g = gen_.number, key] {
      auto r = notify_hosts_updated(reg, ts, res, std::chrono::milliseconds(3000));
      caf::anon_send(hdl, notified_atom::value, g, key, r.ok ? std::string{} : to_string(r));
    }}.detach();
  }

  void on_notified(uint64_t g, const std::string& key, const std::string& problem) {
    events_.emit("notify.sent", {{"slot", key},
                                 {"generation", g},
                                 {"delivered", problem.empty()},
                                 {"cause", problem}});
    if (problem.empty())
      return log("rank 0 ({}) was told of generation {}'s host change", key, g);
    if (g == gen_.number && !gen_.released && !done_ && !finishing_)
      say("warning: could not tell rank 0 ({}) of the host change of generation {}: {}; its "
          "ranks learn of it only through /elastic/update or a failure",
          key, g, problem);
  }

  // -- exits and failures -------------------------------------------------------------

  void on_exit(const rank_exit& ex) {
    auto* s = slot_by_id(ex.rank);
    if (!s || !s->running)
      return;
    s->running = false;
    exit_status st{ex.code, ex.signal, ex.exec_error};
    auto how = describe_exit(st, ex.stopped_by);
    s->exit_code = st.launcher_code();
    ++process_ends_[s->exit_code == 0 ? std::string{"exit 0"}
                                      : fmt::format("code {}", s->exit_code)];
    log("rank {} on {} ended: {}", s->rank, s->key, how);
    if (executor())
      fail_calls(*s, loss_cause(*s, how));
    if (events_.enabled()) {
      nlohmann::json ended{{"rank", s->rank},
                           {"host", hosts_.at(s->endpoint).info.name},
                           {"slot", s->key},
                           {"code", st.launcher_code()},
                           {"signal", st.signal},
                           {"generation", gen_.number},
                           {"retired", s->retired || !is_current(*s) || !in_plan(s->key)}};
      if (!st.exec_error.empty())
        ended["exec_error"] = st.exec_error;
      if (!ex.stopped_by.empty())
        ended["stopped_by"] = ex.stopped_by;
      events_.emit("rank.ended", ended);
    }
    if (!is_current(*s)) {
      slots_.erase(ex.rank); // a replaced process: nothing refers to it any more
      return maybe_finish();
    }
    registrations_.erase(s->key); // its notification service ended with it
    if (s->retired || !in_plan(s->key)) {
      gen_.votes.erase(s->key);
      return maybe_finish();
    }
    // A static executor's ranks end when the owner shuts them down, not before.
    bool early_end = executor() && !elastic_ && !shutdown_requested_;
    if (st.launcher_code() == 0 && !early_end) {
      if (!finishing_) {
        finishing_ = true;
        log("rank {} finished; the job ends when the others do", s->rank);
        // Ranks that wait for another generation are told that there is none.
        for (auto& key : gen_.votes)
          server_->answer_slot(key, slot_not_in_job);
        gen_.votes.clear();
        drop_unlaunched(); // fresh slots of a plan that will not be released
      }
      return maybe_finish();
    }
    auto why = fmt::format("{} {}", st.exec_error.empty() ? "ended with" : "could not start:", how);
    if (!s->channel_problem.empty())
      why = how = fmt::format("broke its executor channel: {} (killed)", s->channel_problem);
    else if (early_end && st.launcher_code() == 0)
      why = how = "ended (exit code 0) while the executor still needed it";
    if (!elastic_)
      return failed_fast(*s, why, how, std::max(st.launcher_code(), 1));
    slot_failed(*s, why);
  }

  // Static jobs: the first rank that fails stops the job, which exits with its code.
  void failed_fast(eslot& s, const std::string& why, const std::string& how, int code) {
    auto host = hosts_.at(s.endpoint).info.name;
    note_failure(fmt::format("rank {} on host {} {}", s.rank, host, why));
    if (!failure_ && !done_ && !interrupted_) {
      failure_ = fmt::format("rank {} on host {} failed first: {}", s.rank, host, how);
      failure_code_ = code;
      say("rank {} on host {} {}{}", s.rank, host, why,
          gen_.plan.size() > 1 ? "; stopping the other ranks" : "");
      teardown();
    }
    maybe_finish();
  }

  void slot_failed(eslot& s, const std::string& why) {
    s.running = false;
    auto& h = hosts_.at(s.endpoint);
    auto what = fmt::format("rank {} on host {} {}", s.rank, h.info.name, why);
    if (!elastic_)
      return fail(what); // a worker that could not be started or launched
    note_failure(what);
    if (finishing_ || done_) {
      if (!failure_)
        failure_ = what;
      return maybe_finish();
    }
    say("{}", what);
    reset_reason_ = "after a failure";
    blacklist(s.endpoint);
    abort_gloo();
    reconsider();
    maybe_finish();
  }

  // -- ending a broken generation's Gloo connections ---------------------------------
  // Horovod 0.28 does not close a failed rank's Gloo sockets (process set 0's contexts
  // leak on shutdown), so a survivor blocked in a receive from a peer that already
  // failed waits for Gloo's timeout (30 s) before it restores its commit and re-joins.
  // The survivors' agents shut those connections down at once (runtime/socket_abort.hpp);
  // the next generation is held until every agent answered (at most 3 s), so no
  // connection of the new generation can be hit.
  void abort_gloo() {
    if (!elastic_ || !server_ || done_ || finishing_)
      return;
    auto gloo = server_->gloo_endpoints();
    if (gloo.empty())
      return; // no Gloo rendezvous in this generation
    std::map<std::string, std::vector<uint32_t>> by_host;
    for (auto& [id, s] : slots_)
      if (s.running && s.launched && !s.retired && is_current(s))
        by_host[s.endpoint].push_back(id);
    std::vector<std::string> gloo_text, keep;
    for (auto& e : gloo)
      gloo_text.push_back(e.str());
    auto a = server_->address();
    auto at = [&](uint16_t port) {
      return a.find(':') == std::string::npos ? fmt::format("{}:{}", a, port)
                                              : fmt::format("[{}]:{}", a, port);
    };
    keep.push_back(at(server_->port()));
    if (torch_store_)
      keep.push_back(at(torch_store_->port()));
    for (auto& [ep, ids] : by_host) {
      auto& h = hosts_.at(ep);
      if (!h.colocator || h.st == ehost::status::lost)
        continue;
      ++aborts_in_flight_;
      auto t0 = clock_type::now();
      request(h.colocator, std::chrono::seconds(3), abort_atom::value, ids, gloo_text, keep)
          .then([this, ep, t0](gloo_abort_report& r) { gloo_aborted(ep, t0, r, {}); },
                [this, ep, t0](caf::error& e) {
                  gloo_aborted(ep, t0, {}, "no answer: " + to_string(e));
                });
    }
  }

  void gloo_aborted(const std::string& ep, clock_type::time_point t0, const gloo_abort_report& r,
                    const std::string& error) {
    --aborts_in_flight_;
    auto host = hosts_.at(ep).info.name;
    auto problem = error.empty() ? fmt::format("{}", fmt::join(r.problems, "; ")) : error;
    auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    log("host {}: shut down {} Gloo connection{} of {} rank process group{} in {:.0f} ms{}", host,
        r.cut, r.cut == 1 ? "" : "s", r.processes, r.processes == 1 ? "" : "s", ms,
        problem.empty() ? "" : " (" + problem + ")");
    events_.emit("gloo.abort",
                 {{"host", host},
                  {"processes", r.processes},
                  {"cut", r.cut},
                  {"ms", ms},
                  {"problem", problem.empty() ? nlohmann::json() : nlohmann::json(problem)}});
    if (r.refused && !gloo_abort_refused_) {
      gloo_abort_refused_ = true;
      say("warning: host {} cannot end the failed generation's Gloo connections ({}: needs "
          "pidfd_getfd, Linux 5.6, and ptrace rights over the ranks, e.g. Yama ptrace_scope "
          "0 or 1); survivors that wait on a failed peer recover only at Gloo's timeout "
          "(HOROVOD_GLOO_TIMEOUT_SECONDS)",
          host, problem);
    }
    if (aborts_in_flight_ == 0)
      check_release();
  }

  void note_failure(const std::string& what) {
    events_.emit("failure", {{"cause", what}});
    if (!first_failure_)
      first_failure_ = what;
    last_failure_ = what;
  }

  void blacklist(const std::string& ep) {
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
      events_.emit(
          "host.blacklisted",
          {{"host", h.info.name}, {"failures", h.failures}, {"cooldown_seconds", nullptr}});
    }
    // Its other ranks stop: SIGTERM now, SIGKILL after the grace period.
    for (auto& [id, s] : slots_) {
      if (s.endpoint != ep || !s.running)
        continue;
      if (server_)
        server_->answer_slot(s.key, slot_not_in_job);
      gen_.votes.erase(s.key);
      if (drop_if_unlaunched(s))
        continue;
      s.retired = true;
      if (s.worker)
        send(s.worker, terminate_atom::value, int32_t{SIGTERM});
      delayed_send(this, job_.kill_grace, retire_atom::value, s.id, int32_t{SIGKILL});
    }
  }

  void on_down(const caf::down_msg& dm) {
    if (dm.reason == caf::exit_reason::normal)
      return;
    for (auto& [ep, h] : hosts_) {
      bool ours = h.colocator && h.colocator.address() == dm.source;
      for (auto& [id, s] : slots_)
        ours = ours || (s.endpoint == ep && s.worker && s.worker.address() == dm.source);
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
      if (host_end_.count(h.info.name))
        host_end_[h.info.name] = "lost";
      h.colocator = nullptr;
      bool had_ranks = false;
      for (auto& [id, s] : slots_) {
        if (s.endpoint != ep || !s.running)
          continue;
        s.running = false;
        if (executor())
          fail_calls(s, fmt::format("rank {} on host {} was lost: {}", s.rank, h.label(), why));
        if (!s.retired && in_plan(s.key))
          had_ranks = true;
        s.retired = true;
        gen_.votes.erase(s.key);
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
        say("{}", what);
        blacklist(ep);
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
        say("warning: {}", what);
        reconsider();
      }
      return maybe_finish();
    }
  }

  // -- the end --------------------------------------------------------------------------

  void maybe_finish() {
    if (!finishing_ && !done_)
      return;
    for (auto& [id, s] : slots_)
      if (s.running)
        return;
    finish();
  }

  void on_interrupt(int32_t sig) {
    if (interrupted_) {
      for (auto& [ep, h] : hosts_)
        if (h.colocator)
          send(h.colocator, kill_atom::value);
      return;
    }
    interrupted_ = sig;
    say("received {}; stopping the job", strsignal(sig));
    teardown();
  }

  void on_store_problem(const std::string& problem) {
    if (store_problems_++ == 0)
      write_all(2, torch_store_problem_message(problem));
    if (job_.torch_store == torch_store_mode::on)
      fail("the torch store could not serve a client (--torch-store on)");
  }

  void fail(const std::string& msg) {
    if (done_)
      return;
    failure_ = msg;
    failure_said_ = true;
    say("error: {}", msg);
    events_.emit("failure", {{"cause", msg}});
    teardown();
  }

  void teardown() {
    if (done_)
      return;
    done_ = true;
    if (!elastic_)
      phase("");
    events_.emit("phase.begin", {{"phase", "teardown"}});
    drop_unlaunched();
    if (server_)
      for (auto& [key, id] : current_)
        server_->answer_slot(key, slot_not_in_job);
    for (auto& [ep, h] : hosts_)
      if (h.colocator && h.st == ehost::status::ready)
        send(h.colocator, terminate_atom::value, static_cast<int32_t>(job_.kill_grace.count()));
    delayed_send(this, job_.kill_grace + std::chrono::seconds(5), deadline_atom::value,
                 uint32_t{dl_teardown});
    maybe_finish();
  }

  void on_deadline(uint32_t which) {
    auto kind = which & 0xf;
    auto serial = which >> 4;
    if (kind == dl_teardown && done_) {
      std::vector<int> left;
      for (auto& [id, s] : slots_)
        if (s.running)
          left.push_back(s.rank);
      if (!left.empty())
        say("ranks {} did not report their end within the grace period; releasing their nodes",
            fmt::join(left, ", "));
      finish();
    } else if (kind == dl_slots && waiting_slots_ && serial == slot_wait_serial_ && !done_) {
      int total = 0;
      for (auto& ep : order_)
        total += hosts_.at(ep).slots();
      fail(fmt::format("elastic timeout ({} s) expired waiting for at least {} slots "
                       "(--min-np); available: {}{}",
                       ec_.elastic_timeout.count() / 1000.0, ec_.min_np, available_text(total),
                       first_failure_ ? "; first failure: " + *first_failure_ : std::string{}));
    } else if (kind == dl_owner && !owner_started_ && !done_) {
      fail(fmt::format("start timeout ({} s) expired waiting for the executor's owner to send "
                       "its start frame",
                       job_.start_timeout.count() / 1000.0));
    } else if (kind == dl_shutdown && !finished_) {
      std::vector<int> left;
      for (auto& [id, s] : slots_)
        if (s.running)
          left.push_back(s.rank);
      say("ranks {} did not end within {} s of closing their channels; stopping them",
          fmt::join(left, ", "), job_.kill_grace.count() / 1000.0);
      teardown();
    } else if (kind == dl_start && !elastic_ && !all_started_ && !done_) {
      fail(fmt::format("start timeout ({} s) expired waiting for: {}",
                       job_.start_timeout.count() / 1000.0, start_waits_for()));
    } else if (kind == dl_barrier && serial == (gen_.number & 0x0fffffff)) {
      if (!gen_.released && !done_ && !finishing_)
        on_barrier_deadline();
      else
        barrier_check_.reset();
    }
  }

  void finish() {
    if (finished_)
      return;
    finished_ = true;
    for (auto& [id, s] : slots_)
      if (s.worker)
        send_exit(s.worker, caf::exit_reason::user_shutdown);
    for (auto& [ep, h] : hosts_)
      if (h.colocator)
        send_exit(h.colocator, caf::exit_reason::user_shutdown);
    server_.reset();
    for (auto& [key, fds] : output_fds_)
      for (int fd : fds)
        if (fd >= 0)
          close_output(fd);
    output_fds_.clear();
    int code = 0;
    if (interrupted_) {
      code = 128 + interrupted_;
    } else if (interrupted_by_owner_ && !failure_) {
      code = 0; // the owner asked for the end before the ranks finished
    } else if (failure_) {
      code = failure_code_;
    } else {
      // Success: every rank of the final generation exited 0 (the fresh slots of a plan
      // that was never released had no process).
      for (auto& [key, row] : gen_.rows) {
        if (!gen_.released && gen_.fresh.count(key))
          continue;
        auto* s = current(key);
        if (!s || s->exit_code != 0) {
          code = 1;
          failure_ =
              fmt::format("rank {} ({}) of the final generation did not exit 0", row.rank, key);
          break;
        }
      }
    }
    if (failure_ && !interrupted_ && !failure_said_)
      say("job failed: {}", *failure_);
    log("job ends with exit code {} after {} generations", code, gen_.number);
    if (!elastic_ && !done_)
      phase("");
    summarize(code);
    if (done_)
      events_.emit("phase.end", {{"phase", "teardown"}});
    events_.emit("job.end", {{"code", code},
                             {"generations", gen_.number},
                             {"cause", failure_ ? nlohmann::json(*failure_) : nlohmann::json()}});
    end_for_owner(code);
    result_->exit_code = code;
    quit();
  }

  // -- output ---------------------------------------------------------------------------

  void print_output(const output_batch& b) {
    auto* s = slot_by_id(b.rank);
    auto tag = output_tag(s ? s->rank : -1, b.stream);
    if (job_.prefix_timestamp) // horovodrun's format: the arrival time before the tag
      tag = fmt::format("{:%a %b %d %H:%M:%S %Y}{}", fmt::localtime(std::time(nullptr)), tag);
    write_lines(b.stream == 1 ? 2 : 1, b.lines, tag);
    if (torch_store_ && !libuv_said_ && s)
      for (auto& line : b.lines)
        if (says_torch_lacks_libuv(line)) {
          libuv_said_ = true;
          write_all(2, torch_without_libuv_message(s->rank));
          if (job_.torch_store == torch_store_mode::on)
            fail("the torch store could not serve a client (--torch-store on)");
          break;
        }
    if (!s || job_.output_dir.empty())
      return;
    open_outputs(s->key);
    if (int fd = output_fds_.at(s->key)[b.stream == 1 ? 1 : 0]; fd >= 0)
      write_lines(fd, b.lines);
  }

  // --output-filename DIR: DIR/<host>:<local rank>/stdout and stderr per slot, created
  // when the slot first starts (a slot's later processes append: ranks change between
  // generations), and DIR/rank.N, a link to the slot that has rank N in the newest
  // generation (horovodrun's paths).
  void open_outputs(const std::string& key) {
    if (job_.output_dir.empty() || output_fds_.count(key))
      return;
    auto dir = fmt::format("{}/{}", job_.output_dir, key);
    ::mkdir(dir.c_str(), 0755);
    std::array<int, 2> fds{-1, -1};
    const char* names[2] = {"stdout", "stderr"};
    for (int i = 0; i < 2; ++i) {
      auto path = fmt::format("{}/{}", dir, names[i]);
      fds[i] = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fds[i] < 0)
        say("warning: cannot write {}: {}", path, std::strerror(errno));
    }
    output_fds_[key] = fds;
  }

  void link_rank_outputs() {
    if (job_.output_dir.empty())
      return;
    for (size_t r = 0; r < std::max(gen_.plan.size(), linked_ranks_); ++r) {
      auto link = fmt::format("{}/rank.{}", job_.output_dir, r);
      ::unlink(link.c_str());
      if (r < gen_.plan.size()
          && ::symlink(slot_key(gen_.plan[r].hostname, gen_.plan[r].local_rank).c_str(),
                       link.c_str())
                 != 0)
        say("warning: cannot link {}: {}", link, std::strerror(errno));
    }
    linked_ranks_ = gen_.plan.size();
  }

  job_config job_;
  bool elastic_; // hosts from discovery, blacklist and continue; else fixed, fail fast
  elastic_config ec_;
  std::shared_ptr<job_result> result_;
  std::mt19937_64 rng_;
  std::string job_id_;
  clock_type::time_point started_;
  std::shared_ptr<address_allowlist> allowlist_ = std::make_shared<address_allowlist>();
  std::unique_ptr<rendezvous_server> server_;
  std::unique_ptr<torch_store_server> torch_store_;
  int store_problems_ = 0;
  bool libuv_said_ = false; // torch_without_libuv_message was printed
  output_acks output_acks_;
  event_log events_;                                     // --events FILE
  std::string phase_;                                    // static: the phase in the event log
  clock_type::time_point phase_at_;                      // ... since
  std::vector<std::pair<std::string, double>> phase_ms_; // finished phases (summary)
  // the closing summary: every host the job used (first ready first) and how it ended
  // ("" = to the end), when each generation formed, how every process ended
  std::vector<std::string> used_hosts_;
  std::map<std::string, std::string> host_end_;
  std::vector<std::pair<uint64_t, clock_type::time_point>> gen_formed_;
  std::map<std::string, int> process_ends_;
  std::vector<std::string> last_listed_;                 // the discovery output last logged
  int master_port_ = 0;                 // --torch-store off: this generation's MASTER_PORT
  std::vector<uint32_t> awaiting_port_; // slots whose launch waits for it
  std::vector<uint32_t> awaiting_release_; // fresh slots: launched when the plan is released

  std::map<std::string, ehost> hosts_;      // by endpoint
  std::vector<std::string> listed_order_;   // endpoints in the latest discovery output's order
  std::vector<std::string> ever_listed_;    // every endpoint ever listed, first listing first
  std::vector<std::string> order_;          // available endpoints in age order
  std::map<uint32_t, eslot> slots_;         // every slot process by id (workers' "rank")
  std::map<std::string, uint32_t> current_; // slot key -> its latest process
  std::map<std::string, std::array<int, 2>> output_fds_; // slot -> stdout, stderr
  size_t linked_ranks_ = 0;                              // DIR/rank.N links made
  uint32_t next_slot_id_ = 0;
  bool discovering_ = false;
  int discovery_runs_ = 0;

  generation gen_;            // the newest generation (released or forming)
  uint64_t released_gen_ = 0; // the last released one: its ranks hold the job's state
  std::vector<slot_info> released_plan_;
  // Horovod's worker notification services by slot, and a change not yet told
  std::map<std::string, worker_registration> registrations_;
  uint64_t notify_pending_ = 0; // the generation whose change rank 0 has not been told
  host_change notify_change_ = host_change::none;
  int64_t last_notify_ts_ = 0;
  std::optional<clock_type::time_point> barrier_check_; // the armed join-deadline check
  std::vector<host_slots> plan_hosts_;
  bool rejoin_wanted_ = false; // a rank that joined asks for the next generation
  bool rejoin_due_ = false;    // ... and no failure explained it in time
  std::string reset_reason_;
  int aborts_in_flight_ = 0;        // Gloo abort requests not answered yet (they hold the release)
  bool gloo_abort_refused_ = false; // said once that an agent cannot do them
  bool waiting_slots_ = false;
  uint32_t slot_wait_serial_ = 0;

  // executor mode
  std::unique_ptr<frame_channel> control_; // the owner's channel
  bool owner_started_ = false;
  bool owner_gone_ = false;
  bool shutdown_requested_ = false;
  bool interrupted_by_owner_ = false;
  std::string boot_; // call 0 of every process
  uint64_t last_call_ = 0;
  uint64_t next_log_ack_ = 0;
  std::map<uint64_t, caf::typed_response_promise<caf::ok_atom>> log_acks_;

  std::deque<std::string> connect_queue_; // agents waiting for a place in the window
  size_t connects_in_flight_ = 0;

  bool all_started_ = false; // static: every rank was started (the start deadline is over)
  size_t launched_ = 0;      // static: processes started so far
  bool finishing_ = false;   // a rank of the current generation exited 0
  bool done_ = false;        // stopping (failure or interrupt)
  bool finished_ = false;
  int interrupted_ = 0;
  std::optional<std::string> failure_;
  int failure_code_ = 1; // the failing rank's code when a rank's failure ended the job
  bool failure_said_ = false;
  std::optional<std::string> first_failure_, last_failure_;
};

} // namespace

driver_full_actor spawn_driver(caf::actor_system& sys, job_config config,
                               std::shared_ptr<job_result> result) {
  return caf::actor_cast<driver_full_actor>(sys.spawn<job>(std::move(config), std::move(result)));
}

} // namespace cafhvd
