// The job actor, declared for the files that define it (actors/job/*.cpp; nothing
// else includes this). Its state and functions are grouped by concern below; each
// concern's functions live in the file named in its section.
//
// The job actor: one lifecycle for static and elastic jobs.
//
//   hosts       a fixed list (-H, --hostfile, or `run`'s own machine) or a discovery
//               script run every interval; each host joins the same way: reachable ->
//               connected (mutual TLS) -> a colocator -> node info -> NIC -> ready
//   generation  ready hosts in age order -> the coordinator's assignment -> a plan (a
//               value, runtime/job/generation); slots of the plan without a process get one
//               (their workers report their host to the coordinator first), processes
//               that run are never restarted
//   barrier     elastic, as horovodrun's driver (the votes and their deadlines are the
//               coordinator's, the release is the job's): generation 1 is released at
//               once and its processes start with it. A later plan is released when every
//               process it carries over voted with GET /rank_and_size/<host>:<lr> (up to
//               --elastic-timeout: they may be in a long step); its fresh slots start at
//               the release with the released plan in their environment and never vote
//               (a real Horovod worker's first hvd.init() reads its environment). Host
//               changes reach running ranks through rank 0's notification service
//               (Horovod's HostsUpdatedRequest) and /elastic/update. Static jobs have one
//               plan, released at once.
//   failure     static (fail fast): the first rank that fails, or a lost agent, stops
//               the job with that rank's code. Elastic: its host is blacklisted (with
//               cooldown if configured), the survivors' agents shut down the broken
//               generation's Gloo connections, and the next generation starts at once,
//               as long as a rank of the last released generation carries the state over.
//   end         the job ends when the final generation's ranks exit 0, or fails with
//               the first failure named; every stop is SIGTERM, grace, SIGKILL.
#pragma once

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

#include "actors/config.hpp"
#include "actors/coordinator.hpp"
#include "actors/driver_util.hpp"
#include "actors/node_actors.hpp"
#include "runtime/launch/channel.hpp"
#include "runtime/job/env.hpp"
#include "runtime/observe/event_log.hpp"
#include "runtime/job/generation.hpp"
#include "runtime/cluster/gpu.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/network/nic_probe.hpp"
#include "runtime/launch/process.hpp"
#include "runtime/horovod/rendezvous_server.hpp"

namespace cafhvd::driver_impl {

// The driver's interface, what its coordinator tells it (coordinator_client_actor, whose
// torch store message the driver already has) and its own messages.
using job_actor = driver_full_actor::extend<
    caf::reacts_to<complete_atom, uint64_t>, caf::reacts_to<rejoin_atom, std::string>,
    caf::reacts_to<late_atom, uint64_t, std::vector<std::string>, std::vector<std::string>>,
    caf::reacts_to<notified_atom, uint64_t, std::string, std::string>,
    caf::reacts_to<reached_atom, uint64_t, std::string, bool, bool>,
    caf::reacts_to<parked_atom, uint64_t, std::string>,
    caf::reacts_to<event_atom, std::string, std::string>,
    caf::reacts_to<discover_atom>,                    // time to run the script
    caf::reacts_to<discover_atom, bool, std::string>, // the script's output or error
    caf::reacts_to<discover_atom, uint64_t>,          // the cluster's table: hosts changed
    caf::reacts_to<rejoin_atom, uint64_t>,            // ranks asked for a new generation
    caf::reacts_to<retire_atom, uint32_t, int32_t>,   // signal a stopped slot's process
    caf::replies_to<caf::get_atom>::with<coordinator_full_actor>, // (tests) its coordinator
    // a discovered host resolved (its address) and reachable ("" = yes) or why not
    caf::reacts_to<probed_atom, std::string, std::string, std::string>>;

// deadline_atom kinds (low 4 bits; the rest is a serial number)
enum : uint32_t {
  dl_teardown = 1,
  dl_slots = 2,
  dl_start = 4,
  dl_owner = 5,      // executor: the owner's start frame
  dl_shutdown = 6,   // executor: ranks end after their channel closed
  dl_rendezvous = 7, // elastic: a fresh process must begin its Gloo rendezvous (serial: slot id)
  dl_verdict = 8     // elastic: an abort inside a rendezvous is judged (serial: slot id)
};

using clock_type = std::chrono::steady_clock;

struct ehost {
  enum class status { connecting, ready, unusable, lost };
  host_spec spec; // from the latest discovery output that listed it
  std::string address;
  status st = status::connecting;
  bool listed = false;
  bool draining = false; // its agent said it drains: never listed until it says it is back
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
  // The node refused more of the job's ranks for lack of slots (other jobs hold them):
  // the job keeps the ranks it runs there (full_cap) until full_until, then asks again.
  int full_cap = -1;
  clock_type::time_point full_until{};
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
    if (full_cap >= 0)
      s = std::min(s, full_cap);
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
  bool running = false;        // its process runs (or is being started)
  bool retired = false;        // stopped or removed by us: its exit is not a failure
  uint64_t joined = 0;         // the last generation it was answered for
  uint64_t rendezvous_gen = 0; // ... and whose hvd.init() it went through (a resumed plan
                               // has none)
  int rank = -1;               // in the current plan, or the last one it had
  int exit_code = -1;
  bool launched = false;               // its process was started
  bool launching = false;              // its launch was asked for
  bool launch_pending = false;         // ... and its host has not answered yet
  bool stop_at_release = false;        // left the plan holding state: stopped once the plan runs
  std::optional<rank_exit> early_exit; // an exit report that overtook that answer
  bool reached = false;                // it began a Gloo rendezvous (PUT /global/rank_<r>)
  std::optional<std::pair<std::string, std::string>> verdict; // an abort judged later: how, why
  uint64_t warm_for = 0;   // a newcomer started for this forming generation: it waits at the
                           // generation's lot until the release (0: started in a released one)
  uint64_t global_gen = 0; // the last generation whose Gloo rendezvous of scope global it
                           // finished, and of cross_<k> (hvd.init()'s last): the last
  uint64_t cross_gen = 0;  // whose hvd.init() it finished, 0 if none (it holds no state)
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

  behavior_type make_behavior() override;

private:
  // -- the core: behaviour, start, end (actors/job/job.cpp) ---------------------------------
  void begin();
  long elapsed_ms() const;
  std::string describe(const caf::error& e);
  eslot* slot_by_id(uint32_t id);
  // Who may send what (actors/senders.hpp): a slot's messages come only from its worker,
  // the coordinator's from the coordinator, a thread's or timer's from this actor.
  bool from_worker(uint32_t slot, const char* what);
  bool from_coordinator(const char* what);
  bool from_itself(const char* what);
  bool from_colocator_of(const std::string& node, const char* what);
  eslot* current(const std::string& key);
  bool is_current(const eslot& s) const;
  ehost* host_by_name(const std::string& name);
  bool in_plan(const std::string& key) const;
  void maybe_finish();
  void on_interrupt(int32_t sig);
  void on_store_problem(const std::string& problem);
  void fail(const std::string& msg);
  void teardown();
  void on_deadline(uint32_t which);
  void finish();
  template <class... Ts> void log(fmt::format_string<Ts...> f, Ts&&... xs) {
    if (job_.verbose)
      write_all(2, fmt::format("caf-hvd [{:>5} ms] job: {}\n", elapsed_ms(),
                               fmt::format(f, std::forward<Ts>(xs)...)));
  }
  // What users always see: generations, blacklisting, waiting.
  template <class... Ts> void say(fmt::format_string<Ts...> f, Ts&&... xs) {
    write_all(2, fmt::format("caf-hvd: {}\n", fmt::format(f, std::forward<Ts>(xs)...)));
  }

  // -- host membership: discovery, connects, readiness, loss (actors/job/hosts.cpp) -----
  // At most connect_window handshakes at once: CAF 0.17 runs every TLS handshake of this
  // process on its one multiplexer thread, so more in flight only starves the heartbeats
  // of the links already up (at 128 agents they timed out) without finishing sooner.
  static constexpr size_t connect_window = 8;
  void run_discovery();
  void discover_from_cluster();
  void discovery_ended();
  void on_drain(const std::string& node, bool on, const std::string& how);
  std::string discovery_name() const;
  void on_discovered(bool ok, const std::string& text);
  void connect_host(const std::string& ep);
  static elastic_config fixed_policy(const job_config& job);
  void start_fixed_hosts();
  std::string start_waits_for();
  void on_reachable(const std::string& ep, const std::string& problem);
  void connect_agent(const std::string& ep);
  void pump_connects();
  void dialed();
  void dial(const std::string& ep);
  std::string connect_error(const caf::error& e, const std::string& peer = {});
  void spawn_colocator(const std::string& ep);
  void query_host(const std::string& ep);
  void warn_if_capped(ehost& h);
  void host_ready(const std::string& ep);
  void host_unusable(const std::string& ep, const std::string& why);
  void start_servers(const ehost& h);
  void blacklist(const std::string& ep);
  void on_down(const caf::down_msg& dm);

  // -- per host: GPUs lent, the network interface (actors/job/devices.cpp) ------------
  std::string gpu_shortage(const ehost& h, size_t need);
  void lend_fixed_gpus();
  void lend_elastic_gpus(const std::string& ep);
  std::optional<std::string> visible_devices(const ehost& h, int local_rank);
  void choose_fixed_nics();
  void fixed_hosts_ready();
  void choose_nic(const std::string& ep);

  // -- generations: plans, the barrier, the release (actors/job/generations.cpp) ------
  void reconsider();
  void assign(const std::vector<host_slots>& hs, int min_np, int max_np);
  void plan_ready(std::vector<slot_info> plan, const std::vector<host_slots>& hs);
  void start_fixed_generation();
  bool previous_generation_survives() const;
  std::string draining_carrier(const std::vector<std::string>& order);
  slot_process process_of(const eslot& s) const;
  void wait_for_slots(int total, bool tell = true);
  std::string available_text(int total);
  void begin_generation(std::vector<slot_info> plan, const std::vector<host_slots>& hs);
  void on_rejoin_request(const std::string& key);
  void on_rejoin(uint64_t gen);
  void on_late(uint64_t g, const std::vector<std::string>& fresh,
               const std::vector<std::string>& carrying);
  void on_alive(uint64_t g, const std::string& key, uint32_t id, uint32_t ms);
  void late_failed(uint64_t g, const std::string& key, const std::string& why);
  void on_complete(uint64_t g);
  void release_generation(bool resumed = false);
  /// keep_released: the released generation's slots stay (the job ends when they do).
  void drop_unlaunched(bool keep_released = false);
  bool drop_if_unlaunched(eslot& s);
  void on_notified(uint64_t g, const std::string& key, const std::string& problem);

  // -- processes: workers, environments, launches, exits (actors/job/launch.cpp) -----
  void start_slots(const std::string& hostname,
                   const std::vector<std::pair<std::string, slot_info>>& rows);
  void fail_running(const std::vector<uint32_t>& ids, const std::string& why);
  bool worker_spawned(uint32_t id, worker_actor w);
  void find_master_port();
  std::optional<std::vector<std::string>> rank_environment(eslot& s);
  void launch_slots(const std::string& ep, const std::vector<uint32_t>& ids);
  void slot_launched(uint32_t id, int32_t pid);
  void launch_answered(const std::vector<uint32_t>& ids);
  void retire_slot(const std::string& key);
  void on_exit(const rank_exit& ex);
  void failed_fast(eslot& s, const std::string& why, const std::string& how, int code);
  void slot_failed(eslot& s, const std::string& why);
  void abort_gloo();
  void send_aborts(const gloo_links& links);
  void gloo_aborted(const std::string& ep, clock_type::time_point t0, const gloo_abort_report& r,
                    const std::string& error);
  void abort_answered();
  void note_failure(const std::string& what);

  // -- the ranks' Gloo rendezvous: who reached it, who finished it, what a process that
  //    never does costs (actors/job/rendezvous.cpp) ----------------------------------
  void on_reached(uint64_t g, const std::string& key, bool cross, bool connected);
  void arm_rendezvous_deadline(const eslot& s);
  void rendezvous_overdue(uint32_t id);
  void fail_unreached(eslot& s);
  void break_generation(const std::string& failed_ep);
  bool collateral_exit(eslot& s, const std::string& how, int signal, const std::string& why);
  void judge_abort(uint32_t id);
  void spare(eslot& s, const std::string& how, const std::string& cause);
  bool holds_state(const eslot& s) const;
  uint64_t initialized_gen(const eslot& s) const;
  bool state_made() const;
  // warm joins: a forming plan's newcomers start at once and wait at its lot
  bool warm_plan() const;
  void open_lot();
  void on_parked(uint64_t g, const std::string& key);
  bool newcomers_ready() const;
  void stop_newcomers(uint64_t keep);
  bool only_newcomers_on(const std::string& ep) const;
  void newcomer_failed(eslot& s, const std::string& what);

  // -- the executor relay: the owner's channel and calls (actors/job/executor.cpp) ----
  bool executor() const;
  bool calls_only() const;
  void open_control();
  void to_owner(frame_kind kind, uint64_t id, uint32_t rank, std::string payload,
                std::function<void()> done = {});
  void owner_broke(const std::string& what);
  void on_control(uint8_t kind, uint64_t id, uint32_t rank, uint32_t deadline, std::string payload);
  eslot* slot_of_rank(uint32_t r);
  void on_call(uint64_t id, uint32_t rank, uint32_t deadline, std::string payload);
  void on_result(uint32_t slot, uint64_t id, std::string payload);
  caf::result<caf::ok_atom> on_log(uint32_t slot, std::string payload);
  void fail_calls(eslot& s, const std::string& cause);
  std::string loss_cause(const eslot& s, const std::string& how);
  void send_rank_table();
  void on_shutdown();
  void on_kill_host(const std::string& name);
  bool runs_on(const std::string& ep, const std::vector<uint32_t>& except) const;
  void host_full(const std::string& ep, const std::vector<uint32_t>& refused,
                 const std::string& why);
  void on_owner_gone(const std::string& problem);
  void end_for_owner(int code);

  // -- output and report: lines, files, phases, summary (actors/job/output.cpp) -------
  void phase(const char* name);
  void summarize(int code);
  void print_output(const output_batch& b);
  void open_outputs(const std::string& key);
  void link_rank_outputs();

  // -- state, by concern ------------------------------------------------------------------
  // the core (actors/job/job.cpp): what was asked, how the job ends
  job_config job_;
  bool elastic_; // hosts from discovery, blacklist and continue; else fixed, fail fast
  elastic_config ec_;
  std::shared_ptr<job_result> result_;
  std::mt19937_64 rng_;
  std::string job_id_;
  clock_type::time_point started_;
  bool table_wait_said_ = false; // the cluster's table could not be reached at first
  coordinator_full_actor coord_; // the job's servers, registrations, assignments, votes
  event_log events_;             // --events FILE
  bool finishing_ = false;       // a rank of the current generation exited 0
  bool done_ = false;            // stopping (failure or interrupt)
  bool finished_ = false;
  int interrupted_ = 0;
  std::optional<std::string> failure_;
  int failure_code_ = 1; // the failing rank's code when a rank's failure ended the job
  bool failure_said_ = false;
  std::optional<std::string> first_failure_, last_failure_;
  int store_problems_ = 0;

  // host membership (actors/job/hosts.cpp, devices.cpp)
  std::map<std::string, ehost> hosts_;    // by endpoint
  std::vector<std::string> listed_order_; // endpoints in the latest discovery output's order
  std::vector<std::string> ever_listed_;  // every endpoint ever listed, first listing first
  std::vector<std::string> order_;        // available endpoints in age order
  std::vector<std::string> last_listed_;  // the discovery output last logged
  bool discovering_ = false;
  // Discovery runs on a timer (every --discovery-interval) and, with --cluster, also when
  // the table nudges: a run the timer found busy, or a nudge that came during a run,
  // waits for that run's end; only the timer's runs set the next timer.
  bool timer_run_ = false, timer_missed_ = false, nudged_ = false;
  caf::actor_addr table_; // the cluster's table last asked: its nudges are taken
  int discovery_runs_ = 0;
  std::deque<std::string> connect_queue_; // agents waiting for a place in the window
  size_t connects_in_flight_ = 0;
  std::string serve_bind_;       // where the servers listen (set with the first ready host)
  std::optional<served> served_; // ... once they do

  // generations (actors/job/generations.cpp)
  generation gen_;             // the newest generation (released or forming)
  uint64_t assign_serial_ = 0; // the newest assignment asked of the coordinator
  uint64_t released_gen_ = 0;  // the last released one: its ranks hold the job's state
  // (generation, slot) pairs said to be slow: past the deadline, alive
  std::set<std::pair<uint64_t, std::string>> slow_told_;
  // A draining node kept in the plan as the carrier of the job's only state (its
  // endpoint; "" if none), and the (endpoint, generation) pairs said so
  std::string carrier_kept_;
  std::set<std::pair<std::string, uint64_t>> carrier_told_;
  std::vector<slot_info> released_plan_;
  std::vector<host_slots> released_hosts_; // its hosts and slots: what the running ranks know
  std::vector<host_slots> plan_hosts_;
  uint64_t resets_ = 0;        // generations released after the first (Horovod's reset count)
  bool rejoin_wanted_ = false; // a rank that joined asks for the next generation
  bool rejoin_due_ = false;    // ... and no failure explained it in time
  std::string reset_reason_;
  bool waiting_slots_ = false;
  bool slot_wait_told_ = false; // said that it waits (not while hosts still connect)
  uint32_t slot_wait_serial_ = 0;
  int aborts_in_flight_ = 0;        // Gloo abort requests not answered (they hold the release)
  uint64_t held_complete_ = 0;      // ... the generation that completed meanwhile
  bool gloo_abort_refused_ = false; // said once that an agent cannot do them

  // processes (actors/job/launch.cpp)
  std::map<uint32_t, eslot> slots_;         // every slot process by id (workers' "rank")
  std::map<std::string, uint32_t> current_; // slot key -> its latest process
  uint32_t next_slot_id_ = 0;
  std::vector<uint32_t> awaiting_release_; // fresh slots: launched when the plan is released
  int master_port_ = 0;                    // --torch-store off: this generation's MASTER_PORT
  std::vector<uint32_t> awaiting_port_;    // slots whose launch waits for it
  bool all_started_ = false; // static: every rank was started (the start deadline is over)
  size_t launched_ = 0;      // static: processes started so far

  // the ranks' Gloo rendezvous (actors/job/rendezvous.cpp)
  bool speaks_gloo_ = false;           // a rank began a Gloo rendezvous: a Horovod-like program
  bool global_done_ = false;           // a rank finished a rendezvous of scope global
  bool cross_done_ = false;            // ... and of a scope cross_<k>
  bool uses_cross_ = false;            // ranks rendezvous in cross_<k> too (Horovod's hvd.init())
  uint64_t broken_gen_ = 0;            // the released generation a failure broke last
  std::set<uint32_t> overdue_;         // past --start-timeout before any rank spoke Gloo
  uint64_t lot_gen_ = 0;               // warm joins: the forming generation whose newcomers park
  uint16_t lot_port_ = 0;              // ... at this port of the rendezvous server (0: not yet)
  std::optional<uint8_t> held_notice_; // its notice, sent once every newcomer waits there
  uint64_t held_for_newcomers_ = 0;    // a generation that completed before they did
  bool notice_sent_ = false;           // the forming generation's notice went out
  bool gen_reason_after_failure_ = false; // ... and it formed after a failure

  // the executor relay (actors/job/executor.cpp)
  std::unique_ptr<frame_channel> control_; // the owner's channel
  bool owner_started_ = false;
  bool owner_gone_ = false;
  bool shutdown_requested_ = false;
  bool interrupted_by_owner_ = false;
  std::string boot_; // call 0 of every process
  uint64_t last_call_ = 0;
  uint64_t next_log_ack_ = 0;
  std::map<uint64_t, caf::typed_response_promise<caf::ok_atom>> log_acks_;

  // output and report (actors/job/output.cpp)
  output_acks output_acks_;
  std::map<std::string, std::array<int, 2>> output_fds_; // slot -> stdout, stderr
  size_t linked_ranks_ = 0;                              // DIR/rank.N links made
  bool libuv_said_ = false;                              // torch_without_libuv_message was printed
  std::string phase_;                                    // static: the phase in the event log
  clock_type::time_point phase_at_;                      // ... since
  std::vector<std::pair<std::string, double>> phase_ms_; // finished phases (summary)
  // the closing summary: every host the job used (first ready first) and how it ended
  // ("" = to the end), when each generation formed, how every process ended
  std::vector<std::string> used_hosts_;
  std::map<std::string, std::string> host_end_;
  std::vector<std::pair<uint64_t, clock_type::time_point>> gen_formed_;
  std::map<std::string, int> process_ends_;
};

} // namespace cafhvd::driver_impl
