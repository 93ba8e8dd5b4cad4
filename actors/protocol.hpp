// The whole caf-hvd protocol on one page: atoms, message types and the typed
// interfaces of the job actor (the driver), the colocator and the worker.
//
//   job ──spawn──▶ colocator (one per node per job)        node agent process
//   job ──spawn──▶ worker (one per slot) ──▶ child process (caf-hvd-exec ▶ command)
//   job ──abort──▶ colocator ─thread─▶ shutdown of its ranks' Gloo sockets (elastic, a
//                                      rank failed: survivors fail now, not at a timeout)
//   job ◀─output/exited── worker     job ◀─tstore── the torch store (protocol problems)
//   guardian ──stop──▶ colocator ──stop──▶ worker          (the agent shuts down)
//
// The coordinator (one per job, beside the job actor; actors/coordinator.cpp):
//   worker ──report(slot, host)──▶ coordinator      (each worker, when it is spawned)
//   job ──serve/allow/assign/expect/barrier/release/leave/notify/gloo/stop──▶ coordinator
//   job ◀──complete/rejoin/late/notified/reached/event/tstore── coordinator
//   rank ══HTTP rank_and_size, PUT worker_addresses══▶ coordinator's rendezvous server
//   rank ══HTTP PUT /<scope>/rank_<r>, DELETE /<scope>/<r>══▶ server ──reached──▶ job
//                                      (a rank began / finished a Gloo rendezvous)
//   newcomer ══HTTP (held)══▶ lot port ──parked──▶ job   (warm joins: it waits at its
//                                      first rendezvous until its plan's release)
//
// The cluster (actors/cluster.cpp, actors/joiner.cpp; every agent publishes its table actor
// on its port):
//   joiner (agent with --join) ──join(ticket)/update/left──▶ table (the agent it joined)
//   table ──monitor──▶ joiner (its link breaks: lost)   joiner ──monitor──▶ table (re-join)
//   caf-hvd status ──table(driver ticket)──▶ table ──▶ cluster_view (or where the table is)
//   driver --cluster ──place(request, driver ticket)──▶ table ──▶ placement (or: wait)
//   caf-hvd drain ──drain(node, admin ticket)──▶ table ──drain──▶ that node's joiner
//   driver ──spawn colocator(driver ticket)──▶ agent (a ticket of another agent is refused)
//
// Executor mode (runtime/launch/channel.hpp frames; payloads are opaque):
//   owner ═frames═▶ job ──call──▶ worker ═frames═▶ rank process
//   owner ◀═frames═ job ◀─result/log/chanfail── worker ◀═frames═ rank process
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "runtime/job/assignment.hpp"
#include "runtime/cluster/credential_files.hpp"
#include "runtime/cluster/membership.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/network/nic_probe.hpp"

namespace cafhvd {

// -- atoms (at most 10 characters) ---------------------------------------------------

using node_atom = caf::atom_constant<caf::atom("nodeinfo")>;
using port_atom = caf::atom_constant<caf::atom("freeport")>;
using launch_atom = caf::atom_constant<caf::atom("launch")>;
using output_atom = caf::atom_constant<caf::atom("output")>;
using exited_atom = caf::atom_constant<caf::atom("exited")>;
using enlist_atom = caf::atom_constant<caf::atom("enlist")>;
using terminate_atom = caf::atom_constant<caf::atom("terminate")>;
using kill_atom = caf::atom_constant<caf::atom("kill")>;
using interrupt_atom = caf::atom_constant<caf::atom("interrupt")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using probe_atom = caf::atom_constant<caf::atom("probe")>;
using tstore_atom = caf::atom_constant<caf::atom("tstore")>;
using probed_atom = caf::atom_constant<caf::atom("probed")>;
using discover_atom = caf::atom_constant<caf::atom("discover")>;
using vote_atom = caf::atom_constant<caf::atom("vote")>;
using rejoin_atom = caf::atom_constant<caf::atom("rejoin")>;
using retire_atom = caf::atom_constant<caf::atom("retire")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using register_atom = caf::atom_constant<caf::atom("wregister")>;
using notified_atom = caf::atom_constant<caf::atom("notified")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using alive_atom = caf::atom_constant<caf::atom("alive")>;
// executor mode
using call_atom = caf::atom_constant<caf::atom("call")>;
using result_atom = caf::atom_constant<caf::atom("result")>;
using log_atom = caf::atom_constant<caf::atom("log")>;
using chanfail_atom = caf::atom_constant<caf::atom("chanfail")>;
using chanend_atom = caf::atom_constant<caf::atom("chanend")>;
using close_atom = caf::atom_constant<caf::atom("chclose")>;
using control_atom = caf::atom_constant<caf::atom("control")>;
using gpu_atom = caf::atom_constant<caf::atom("gpus")>;
using workers_atom = caf::atom_constant<caf::atom("workers")>;
// the coordinator
using report_atom = caf::atom_constant<caf::atom("wreport")>;
using serve_atom = caf::atom_constant<caf::atom("serve")>;
using allow_atom = caf::atom_constant<caf::atom("allow")>;
using assign_atom = caf::atom_constant<caf::atom("assign")>;
using expect_atom = caf::atom_constant<caf::atom("expect")>;
using barrier_atom = caf::atom_constant<caf::atom("barrier")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using gone_atom = caf::atom_constant<caf::atom("gone")>;
using notify_atom = caf::atom_constant<caf::atom("notify")>;
using complete_atom = caf::atom_constant<caf::atom("complete")>;
using late_atom = caf::atom_constant<caf::atom("late")>;
using event_atom = caf::atom_constant<caf::atom("event")>;
using reached_atom = caf::atom_constant<caf::atom("reached")>;
using lot_atom = caf::atom_constant<caf::atom("lot")>;
using parked_atom = caf::atom_constant<caf::atom("parked")>;
using gloo_atom = caf::atom_constant<caf::atom("gloo")>;
// elastic: a rank failed, the broken generation's Gloo connections end at once
using abort_atom = caf::atom_constant<caf::atom("gabort")>;
using aborted_atom = caf::atom_constant<caf::atom("gaborted")>;
// the cluster's membership (actors/cluster.hpp)
using join_atom = caf::atom_constant<caf::atom("join")>;
using update_atom = caf::atom_constant<caf::atom("update")>;
using table_atom = caf::atom_constant<caf::atom("table")>;
using left_atom = caf::atom_constant<caf::atom("left")>;
using place_atom = caf::atom_constant<caf::atom("place")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
constexpr node_atom node_atom_v{};
constexpr port_atom port_atom_v{};
constexpr launch_atom launch_atom_v{};
constexpr output_atom output_atom_v{};
constexpr exited_atom exited_atom_v{};
constexpr enlist_atom enlist_atom_v{};
constexpr terminate_atom terminate_atom_v{};
constexpr kill_atom kill_atom_v{};
constexpr interrupt_atom interrupt_atom_v{};
constexpr deadline_atom deadline_atom_v{};
constexpr shutdown_atom shutdown_atom_v{};
constexpr probe_atom probe_atom_v{};
constexpr tstore_atom tstore_atom_v{};
constexpr probed_atom probed_atom_v{};
constexpr discover_atom discover_atom_v{};
constexpr vote_atom vote_atom_v{};
constexpr rejoin_atom rejoin_atom_v{};
constexpr retire_atom retire_atom_v{};
constexpr stop_atom stop_atom_v{};

// -- messages ------------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, interface_addr& x) {
  return f(caf::meta::type_name("interface_addr"), x.name, x.address, x.prefix, x.loopback);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, probe_target& x) {
  return f(caf::meta::type_name("probe_target"), x.host, x.address, x.port);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, probe_result& x) {
  return f(caf::meta::type_name("probe_result"), x.iface, x.local_address, x.host, x.address, x.ok,
           x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, signed_ticket& x) {
  return f(caf::meta::type_name("signed_ticket"), x.cert, x.body, x.signature);
}

/// What a colocator tells the driver about its node.
struct node_info {
  std::string name;        // the node's identity in jobs (HOROVOD_HOSTNAME)
  std::string os_hostname; // the machine's hostname
  int32_t pid = 0;         // the agent's process id
  uint32_t slots = 0;      // slots the agent offers; 0 = not limited
  std::vector<interface_addr> interfaces;
  uint16_t probe_port = 0;        // the colocator's NIC probe responder
  std::vector<int32_t> gpus;      // the node's devices (CUDA indices)
  std::vector<int32_t> gpus_free; // ... that no job holds right now
  std::string gpu_source;         // how the node knows them (--gpus, NVML, nvidia-smi)
  uint32_t rank_uid = 0;          // the account the job's ranks run as there
  bool draining = false;          // the node drains now (a colocator that starts says so)
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, node_info& x) {
  return f(caf::meta::type_name("node_info"), x.name, x.os_hostname, x.pid, x.slots, x.interfaces,
           x.probe_port, x.gpus, x.gpus_free, x.gpu_source, x.rank_uid,
           x.draining);
}

/// Devices a node lends to a job: every device the job holds there, or none and why.
struct gpu_lease {
  std::vector<int32_t> devices;
  std::string why;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, gpu_lease& x) {
  return f(caf::meta::type_name("gpu_lease"), x.devices, x.why);
}

/// What a worker runs: the user's command with its complete environment.
struct launch_spec {
  std::vector<std::string> argv;
  std::vector<std::string> env; // KEY=VALUE
  std::string cwd;
  // executor mode: the process gets a frame channel (descriptor 4) to its worker
  bool executor = false;
  std::string boot;       // call 0, written to the channel at start ("" = none)
  uint64_t max_frame = 0; // largest payload the rank may send
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, launch_spec& x) {
  return f(caf::meta::type_name("launch_spec"), x.argv, x.env, x.cwd, x.executor, x.boot,
           x.max_frame);
}

/// One node's share of a launch, in one message: what every rank there has in common
/// is sent once, each rank adds only its own variables (rank numbers, devices, ...).
struct launch_batch {
  std::vector<std::string> argv;
  std::string cwd;
  std::vector<std::string> common_env; // KEY=VALUE pairs every rank of the batch has
  bool executor = false;
  std::string boot;
  uint64_t max_frame = 0;
  std::vector<uint32_t> slots;                // the workers (slot ids) to launch
  std::vector<std::vector<std::string>> envs; // per slot: its pairs beyond common_env
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, launch_batch& x) {
  return f(caf::meta::type_name("launch_batch"), x.argv, x.cwd, x.common_env, x.executor, x.boot,
           x.max_frame, x.slots, x.envs);
}

/// Whole lines a rank wrote to one stream (0 = stdout, 1 = stderr), in order.
struct output_batch {
  uint32_t rank = 0;
  int32_t stream = 0;
  std::vector<std::string> lines;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, output_batch& x) {
  return f(caf::meta::type_name("output_batch"), x.rank, x.stream, x.lines);
}

/// How a rank's process ended.
struct rank_exit {
  uint32_t rank = 0;
  std::string host;
  int32_t code = 0;       // exit code (when signal == 0)
  int32_t signal = 0;     // terminating signal, 0 if the process exited
  std::string exec_error; // set when the command could not be executed (code 127)
  std::string stopped_by; // set when its node agent stopped it (the agent shut down)
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, rank_exit& x) {
  return f(caf::meta::type_name("rank_exit"), x.rank, x.host, x.code, x.signal, x.exec_error,
           x.stopped_by);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, slot_info& x) {
  return f(caf::meta::type_name("slot_info"), x.hostname, x.rank, x.local_rank, x.cross_rank,
           x.size, x.local_size, x.cross_size);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, host_slots& x) {
  return f(caf::meta::type_name("host_slots"), x.hostname, x.slots);
}

/// The job's servers, started by the coordinator ("" error = up).
struct served {
  std::string error;
  std::string address;     // where both listen
  uint16_t port = 0;       // rendezvous (Horovod's HTTP key/value protocol)
  uint16_t store_port = 0; // torch's TCPStore (0: --torch-store off)
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, served& x) {
  return f(caf::meta::type_name("served"), x.error, x.address, x.port, x.store_port);
}

/// A generation's ranks, or why there are none ("" error = a plan).
struct assignment {
  std::string error;
  std::vector<slot_info> plan; // in rank order, local and cross ranks filled in
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, assignment& x) {
  return f(caf::meta::type_name("assignment"), x.error, x.plan);
}

/// A slot whose running process a forming generation carries over: it must vote.
struct carried_slot {
  std::string key; // host:local_rank
  std::string host;
  int64_t started_ns = 0; // when its process was asked for (steady clock)
  uint64_t joined = 0;    // the last released generation it was answered for (0: none)
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, carried_slot& x) {
  return f(caf::meta::type_name("carried_slot"), x.key, x.host, x.started_ns, x.joined);
}

/// The Gloo pair addresses the ranks of the current plan published in the rendezvous
/// store, and the job's own server endpoints (never cut), as "ip:port".
struct gloo_links {
  std::vector<std::string> gloo;
  std::vector<std::string> keep;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, gloo_links& x) {
  return f(caf::meta::type_name("gloo_links"), x.gloo, x.keep);
}

/// A generation the job formed: the coordinator holds its barrier.
struct barrier_spec {
  uint64_t number = 0;
  std::vector<slot_info> plan;
  std::vector<std::string> fresh;    // slots whose processes start at the release
  std::vector<carried_slot> carried; // slots that vote before the release
  std::string update;                // /elastic/update's text for it
  bool release_now = false;          // no barrier: generation 1, or a static job
  bool hold_update = false;          // publish `update` with the notice (warm joins), not now
  // The plan is the released one, whose ranks never heard of the plan it replaces: they
  // go on as they are (released at once; the servers keep their state).
  bool resume = false;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, barrier_spec& x) {
  return f(caf::meta::type_name("barrier_spec"), x.number, x.plan, x.fresh, x.carried, x.update,
           x.release_now, x.hold_update, x.resume);
}

/// What a node's agent did to end a broken generation's Gloo connections.
struct gloo_abort_report {
  uint32_t processes = 0;            // rank processes looked at
  uint32_t cut = 0;                  // connections shut down
  std::vector<std::string> problems; // what failed, with the OS error
  bool refused = false;              // pidfd_getfd is not allowed or not available here
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gloo_abort_report& x) {
  return f(caf::meta::type_name("gloo_abort_report"), x.processes, x.cut, x.problems, x.refused);
}

// -- interfaces ----------------------------------------------------------------------

/// The part of the coordinator that node-side actors talk to: each worker reports the
/// host it runs on (its node agent's name) and its slot when it is spawned.
using coordinator_actor = caf::typed_actor<caf::reacts_to<report_atom, uint32_t, std::string>>;

/// The coordinator's interface for its job (and the rendezvous server's threads).
using coordinator_full_actor = coordinator_actor::extend<
    // start the rendezvous server and torch store on this address
    caf::replies_to<serve_atom, std::string>::with<served>,
    // the servers admit this host's addresses (host name, addresses, whether its agent
    // runs on the driver's machine: loopback clients speak only for such hosts)
    caf::reacts_to<allow_atom, std::string, std::vector<std::string>, bool, uint32_t>,
    // a generation's ranks over these hosts (Horovod's algorithm): min np, max np (0: none)
    caf::replies_to<assign_atom, std::vector<host_slots>, int32_t, int32_t>::with<assignment>,
    // workers of these slots are being spawned on this host, by a colocator on this node
    // (reports count only from there): answered when each reported (per slot "" or what
    // was wrong: another host, no report before the start timeout)
    caf::replies_to<expect_atom, std::vector<uint32_t>, std::string,
                    caf::node_id>::with<std::vector<std::string>>,
    caf::reacts_to<barrier_atom, barrier_spec>, // a generation formed
    // warm joins: the port of forming generation G's parking lot, where its newcomers
    // wait at their first rendezvous until its release (0: none could be opened)
    caf::replies_to<lot_atom, uint64_t>::with<uint16_t>,
    caf::reacts_to<release_atom, uint64_t>,  // the job releases generation G
    caf::reacts_to<leave_atom, std::string>, // the slot is not in the job: answered -1
    caf::reacts_to<gone_atom, std::string>,  // the slot's process ended
    // generation G changed the hosts of running ranks (host_change as a number): tell
    // rank 0's notification service
    caf::reacts_to<notify_atom, uint64_t, uint8_t>,
    caf::reacts_to<stop_atom>, // no generation follows: every vote is answered -1
    // the current plan's Gloo connections' endpoints (a rank failed: they are cut)
    caf::replies_to<gloo_atom>::with<gloo_links>,
    // from the rendezvous server's thread: GET /rank_and_size/<host>:<lr>, and
    // PUT /worker_addresses/<host>:<lr> (body)
    caf::reacts_to<vote_atom, std::string, int32_t>,
    caf::reacts_to<register_atom, std::string, int32_t, std::string>,
    // ... and a rank's progress in the Gloo rendezvous of scope global or cross_<k>: (the
    // store's generation, scope, rank in it, false: its first PUT /<scope>/rank_<r>, true:
    // its DELETE /<scope>/<r>, the client's address)
    caf::reacts_to<reached_atom, uint64_t, std::string, int32_t, bool, std::string>,
    // ... and a newcomer's first request held at lot G: PUT /global/rank_<r> (G, r, the
    // client's address); both count only from an address of the rank's host
    caf::reacts_to<parked_atom, uint64_t, int32_t, std::string>,
    // from a notification thread: (G, slot, "" or why not)
    caf::reacts_to<notified_atom, uint64_t, std::string, std::string>,
    // a slot that holds state missed generation G's join deadline but showed a sign of
    // life this many ms ago (its worker said): it is waited for until --elastic-timeout
    // after that (G, slot, ms)
    caf::reacts_to<alive_atom, uint64_t, std::string, uint32_t>,
    caf::reacts_to<deadline_atom, uint64_t>>; // a barrier or registration deadline

/// What the coordinator tells its job.
using coordinator_client_actor = caf::typed_actor<
    caf::reacts_to<complete_atom, uint64_t>, // every slot generation G carries over voted
    // a slot that joined the released generation asks for the next one (it saw a failure)
    caf::reacts_to<rejoin_atom, std::string>,
    // generation G's join deadlines passed: slots that never joined (--start-timeout) and
    // slots that held state (--elastic-timeout)
    caf::reacts_to<late_atom, uint64_t, std::vector<std::string>, std::vector<std::string>>,
    caf::reacts_to<notified_atom, uint64_t, std::string, std::string>, // as above
    // the process of a slot of released generation G reached its Gloo rendezvous (false)
    // or connected to every peer in it (true), of scope global or (cross: true) cross_<k>
    // (slot, cross, connected)
    caf::reacts_to<reached_atom, uint64_t, std::string, bool, bool>,
    // the newcomer of this slot of forming generation G waits at G's lot
    caf::reacts_to<parked_atom, uint64_t, std::string>,
    caf::reacts_to<tstore_atom, std::string>,              // a torch store problem
    caf::reacts_to<event_atom, std::string, std::string>>; // for the event log: name, JSON

/// The part of the driver that node-side actors talk to. Output and executor logs are
/// requests so that the worker holds a bounded number in flight (flow control end to
/// end). Executor messages name the slot (the id the worker was spawned with).
using driver_actor =
    caf::typed_actor<caf::replies_to<output_atom, output_batch>::with<caf::ok_atom>,
                     caf::reacts_to<exited_atom, rank_exit>,
                     // the job's torch store closed a client for a protocol violation
                     caf::reacts_to<tstore_atom, std::string>,
                     // executor: a rank's answer to a call (slot, call id, payload)
                     caf::reacts_to<result_atom, uint32_t, uint64_t, std::string>,
                     // executor: a rank's log record (slot, payload)
                     caf::replies_to<log_atom, uint32_t, std::string>::with<caf::ok_atom>,
                     // executor: the rank broke its channel's rules (slot, what); its
                     // process is killed, the exit report follows
                     caf::reacts_to<chanfail_atom, uint32_t, std::string>,
                     // a node of the job drains (true: it takes no new ranks; elastic jobs
                     // leave it) or is back (false): (node name, on, how, for messages)
                     caf::reacts_to<drain_atom, std::string, bool, std::string>,
                     // the job was cancelled ('caf-hvd cancel': node name, by whom); that
                     // node's colocator stops its ranks
                     caf::reacts_to<cancel_atom, std::string, std::string>>;

/// The driver's full interface: node-side messages plus its own signals and deadlines.
using driver_full_actor = driver_actor::extend<
    caf::reacts_to<interrupt_atom, int32_t>, // SIGINT/SIGTERM received by the driver
    caf::reacts_to<deadline_atom, uint32_t>, // a phase's deadline (phase number)
    caf::reacts_to<output_atom, uint64_t>,   // output batch N was written (flow control)
    // executor: a frame from the owner's channel (kind, id, rank, deadline, payload)
    caf::reacts_to<control_atom, uint8_t, uint64_t, uint32_t, uint32_t, std::string>,
    caf::reacts_to<chanend_atom, std::string>, // the owner's channel ended (problem)
    caf::reacts_to<log_atom, uint64_t>>;       // log record N reached the owner

/// One slot's process: runs the command, streams output, reports the exit.
using worker_actor =
    caf::typed_actor<caf::replies_to<launch_atom, launch_spec>::with<int32_t>, // pid of the rank's
                                                                               // process
                     caf::reacts_to<terminate_atom, int32_t>, // send a signal to the rank
                     // the agent shuts down: SIGTERM, and say so in the exit report
                     caf::reacts_to<stop_atom, std::string>,
                     caf::reacts_to<output_atom, output_batch>, // from its reader thread
                     caf::reacts_to<exited_atom, rank_exit>,    // from its reader thread
                     // executor: run a call (id, deadline ms or 0, payload)
                     caf::reacts_to<call_atom, uint64_t, uint32_t, std::string>,
                     // executor: end the channel (the process reads EOF and exits)
                     caf::reacts_to<close_atom>,
                     // executor, from the channel's reader thread
                     caf::reacts_to<result_atom, uint64_t, std::string>,
                     caf::reacts_to<log_atom, std::string>,
                     caf::reacts_to<chanend_atom, std::string>, // closed ("" = clean EOF)
                     // ms since the rank's last sign of life: CPU time used by its process
                     // tree (sampled each second) or output; from the job
                     caf::replies_to<alive_atom>::with<uint32_t>,
                     caf::reacts_to<deadline_atom, uint64_t>>;  // call N's deadline

/// One node's side of a job: its workers, free ports, interfaces, NIC probes, cleanup.
using colocator_actor = caf::typed_actor<
    caf::replies_to<node_atom>::with<node_info>, caf::replies_to<port_atom>::with<int32_t>,
    // probe the targets from these local interfaces (all non-loopback ones if empty)
    caf::replies_to<probe_atom, std::vector<probe_target>,
                    std::vector<std::string>>::with<std::vector<probe_result>>,
    caf::reacts_to<probed_atom, uint64_t, std::vector<probe_result>>, // from a probe thread
    caf::reacts_to<enlist_atom, worker_actor>, // a worker of this node starts
    // executor mode: call `id` (deadline ms, payload) for the workers of these slots, one
    // message per node and call instead of one per rank
    caf::reacts_to<call_atom, uint64_t, uint32_t, std::string, std::vector<uint32_t>>,
    // lend N more devices to this job (held until the colocator ends): every device the
    // job holds here, or none and why not
    caf::replies_to<gpu_atom, uint32_t>::with<gpu_lease>,
    // per-node batching: spawn this node's workers for these slots (one round trip per
    // node, not per rank), then launch them; pids in the batch's order (0: not started,
    // its exit report says why). The count: the job's ranks on the node that are ending
    // (retired or stopped, still running), whose node slots the new ones may wait for.
    caf::replies_to<workers_atom, std::vector<uint32_t>, uint32_t>::with<std::vector<worker_actor>>,
    caf::replies_to<launch_atom, launch_batch>::with<std::vector<int32_t>>,
    // elastic, after a rank failed: shut down the Gloo connections of these slots' rank
    // processes (slots; Gloo's listening addresses and the job's server endpoints, as
    // "ip:port"; see runtime/network/socket_abort.hpp), on a thread; answered when done
    caf::replies_to<abort_atom, std::vector<uint32_t>, std::vector<std::string>,
                    std::vector<std::string>>::with<gloo_abort_report>,
    caf::reacts_to<aborted_atom, uint64_t, gloo_abort_report>, // from an abort thread
    caf::reacts_to<terminate_atom, int32_t>, // SIGTERM every rank, SIGKILL after grace (ms)
    caf::reacts_to<stop_atom, std::string>,  // the agent shuts down (why): as terminate
    // the node drains (true) or is back (false), how: told to the job's driver
    caf::reacts_to<drain_atom, bool, std::string>,
    caf::reacts_to<deadline_atom, uint64_t>, // a slot handover's deadline (its own timer)
    // from its agent: job J (of owner O; "": any owner) was cancelled by B (the job's
    // ranks stop; the driver is told)
    caf::reacts_to<cancel_atom, std::string, std::string, std::string>,
    caf::reacts_to<kill_atom>>; // the grace period is over

// -- the cluster's membership -----------------------------------------------------------

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, job_summary& x) {
  return f(caf::meta::type_name("job_summary"), x.job, x.owner, x.ranks, x.gpus, x.since_ms);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("member_info"), x.name, x.address, x.port, x.slots, x.cpus, x.gpus,
           x.gpus_free, x.labels, x.started_ms, x.jobs, x.draining, x.refused_connections,
           x.refused_messages);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, member_row& x) {
  return f(caf::meta::type_name("member_row"), x.info, x.state, x.certificate, x.shared,
           x.joined_ms, x.last_seen_ms, x.gone_ms, x.drained);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, cluster_view& x) {
  return f(caf::meta::type_name("cluster_view"), x.holder, x.redirect, x.now_ms, x.nodes,
           x.waiting, x.placed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement_request& x) {
  return f(caf::meta::type_name("placement_request"), x.job, x.np, x.spread, x.labels, x.hold_ms,
           x.cpus_per_slot, x.gpus_per_slot);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, placed_host& x) {
  return f(caf::meta::type_name("placed_host"), x.name, x.address, x.port, x.slots, x.holder);
}

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, placement& x) {
  return f(caf::meta::type_name("placement"), x.error, x.waiting, x.waiting_for, x.hosts);
}

/// The table's answer to a join: "" and the member's token (its news and its leaving
/// carry it), or why not.
struct join_answer {
  std::string error;
  uint64_t token = 0;
  // an administrator drained this node while it was away: it drains now (the table kept
  // the drain; the administrator's ticket would have expired by then)
  bool drained = false;
  // an administrator undrained this node while it was away: a drain the node kept across
  // its own restart (--state-dir) ends now
  bool undrained = false;
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, join_answer& x) {
  return f(caf::meta::type_name("join_answer"), x.error, x.token, x.drained, x.undrained);
}

/// The actor every node agent publishes on its port. The agent others join holds the
/// cluster's table; one that joined another answers `table` with where that one is.
using cluster_actor = caf::typed_actor<
    // an agent joins (its joiner actor, which the table monitors; what it reports; a
    // ticket signed with its node key, purpose "join", audience the table's node id,
    // subject its name): "" or why not
    caf::replies_to<join_atom, caf::actor, member_info, signed_ticket>::with<join_answer>,
    // a joined agent's news (its token, what it reports), at most 4 a second
    caf::reacts_to<update_atom, uint64_t, member_info>,
    caf::reacts_to<left_atom, uint64_t, std::string>, // a joined agent stops (token, name)
    // the table, for a driver (ticket purpose "status", audience the table's node id)
    caf::replies_to<table_atom, signed_ticket>::with<cluster_view>,
    // slots for a job (driver ticket: purpose "place", subject the job id); a waiting job
    // asks again, once a second, until it is placed. The table monitors the asking actor,
    // which lives as long as the driver: its end frees what the table held for the job
    caf::replies_to<place_atom, placement_request, signed_ticket>::with<placement>,
    // an elastic job's discovery (job id, labels and what a rank needs, as for place;
    // driver ticket: purpose "discover", subject the job id): the live nodes and the
    // slots it may use there. The table
    // keeps the asking actor (monitored) and sends it (discover_atom, uint64_t serial)
    // as soon as that answer would change: the job asks again, at once
    caf::replies_to<discover_atom, placement_request, signed_ticket>::with<placement>,
    // an administrator drains (true) or undrains a node (its name; an admin ticket,
    // purpose "drain" or "undrain", subject the node): "" or why not; the table passes
    // the ticket on to that node's joiner, which checks it too
    caf::replies_to<drain_atom, std::string, bool, signed_ticket>::with<std::string>,
    // the job's owner (driver ticket) or an administrator (admin ticket) cancels a job
    // (purpose "cancel", subject the job id): "" and the nodes told, or why not; the
    // table passes the ticket on to each node that runs the job, which checks it too
    caf::replies_to<cancel_atom, std::string, signed_ticket>::with<std::string,
                                                                   std::vector<std::string>>,
    caf::reacts_to<deadline_atom, uint64_t>>; // its own timer (with its random token)

/// Names under which node agents offer actors for remote spawn.
inline constexpr const char* colocator_type_name = "colocator";
inline constexpr const char* worker_type_name = "worker";

} // namespace cafhvd
