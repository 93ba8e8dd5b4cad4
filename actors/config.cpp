// Registration of caf-hvd's message types and spawnable actors.
#include "actors/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "actors/node_actors.hpp"
#include "actors/protocol.hpp"
#include "actors/senders.hpp"
#include "runtime/observe/line_budget.hpp"
#include "runtime/network/net.hpp"

namespace cafhvd {

hvd_config::hvd_config() {
  add_message_type<interface_addr>("cafhvd::interface_addr");
  add_message_type<node_info>("cafhvd::node_info");
  add_message_type<probe_target>("cafhvd::probe_target");
  add_message_type<probe_result>("cafhvd::probe_result");
  add_message_type<launch_spec>("cafhvd::launch_spec");
  add_message_type<gpu_lease>("cafhvd::gpu_lease");
  add_message_type<launch_batch>("cafhvd::launch_batch");
  add_message_type<std::vector<worker_actor>>("std::vector<cafhvd::worker_actor>");
  add_message_type<worker_actor>("cafhvd::worker_actor");
  add_message_type<std::vector<uint32_t>>("std::vector<uint32_t>");
  add_message_type<std::vector<int32_t>>("std::vector<int32_t>");
  add_message_type<output_batch>("cafhvd::output_batch");
  add_message_type<rank_exit>("cafhvd::rank_exit");
  add_message_type<gloo_abort_report>("cafhvd::gloo_abort_report");
  add_message_type<driver_actor>("cafhvd::driver_actor");
  add_message_type<coordinator_actor>("cafhvd::coordinator_actor");
  add_message_type<gloo_links>("cafhvd::gloo_links");
  add_message_type<signed_ticket>("cafhvd::signed_ticket");
  add_message_type<job_summary>("cafhvd::job_summary");
  add_message_type<std::vector<job_summary>>("std::vector<cafhvd::job_summary>");
  add_message_type<member_info>("cafhvd::member_info");
  add_message_type<member_row>("cafhvd::member_row");
  add_message_type<std::vector<member_row>>("std::vector<cafhvd::member_row>");
  add_message_type<cluster_view>("cafhvd::cluster_view");
  add_message_type<placement_request>("cafhvd::placement_request");
  add_message_type<placement>("cafhvd::placement");
  add_message_type<join_answer>("cafhvd::join_answer");
  add_actor_type(colocator_type_name, colocator_fn);
  // A foreign CAF application that finds the port is refused at the handshake, and so is
  // a caf-hvd from before tickets (2): it would take a joining agent's node certificate
  // for a driver's.
  set("middleman.app-identifiers", std::vector<std::string>{"caf-hvd/8"});
  // Two scheduler threads fit this kind of machine; more only adds polling.
  set("scheduler.max-threads", size_t{2});
  // The sharing scheduler: idle workers sleep on a condition variable and wake when work
  // arrives. Work stealing polls first (100 tries, then 500 with 50 us sleeps, then 10 ms
  // waits): an idle agent spent about 1% of a core, and a driver's polling after every
  // burst of messages took the CPU from the ranks it had just started (run -np 4 of
  // /bin/true: 24.2 ms with work stealing, 20.8 ms with sharing; BENCHMARKS.md). The
  // messages a job sends are few and batched, so stealing's throughput is not needed.
  set("scheduler.policy", caf::atom("sharing"));
}

liveness liveness::from_seconds(double seconds) {
  if (!(seconds >= 1 && seconds <= 3600))
    throw std::invalid_argument(fmt::format(
        "--link-timeout {}: give the seconds of silence after which a driver/agent link "
        "counts as dead, from 1 to 3600 (default {})",
        seconds, default_seconds));
  liveness l;
  l.timeout = std::chrono::milliseconds(static_cast<long>(seconds * 1000));
  l.heartbeat = std::min(std::chrono::milliseconds{500}, l.timeout / 6);
  return l;
}

void hvd_config::enable_network(const liveness& l, const cluster_credentials* creds) {
  net::module().enable_network(*this, l.heartbeat, l.timeout, creds);
}

const node_settings& settings_of(caf::actor_system& sys) {
  return *static_cast<const hvd_config&>(sys.config()).node;
}

caf::actor spawn_guardian(caf::actor_system& sys) {
  struct state {
    std::vector<caf::actor> colocators;
    bool stopping = false;
  };
  return sys.spawn([](caf::stateful_actor<state>* self) -> caf::behavior {
    self->set_exit_handler([](caf::exit_msg&) {});
    self->set_down_handler([=](caf::down_msg& dm) {
      auto& c = self->state.colocators;
      c.erase(std::remove_if(c.begin(), c.end(), [&](auto& a) { return a.address() == dm.source; }),
              c.end());
      if (self->state.stopping && c.empty())
        self->quit(caf::exit_reason::user_shutdown);
    });
    auto stop = [=](const std::string& why) {
      self->state.stopping = true;
      if (self->state.colocators.empty())
        return self->quit(caf::exit_reason::user_shutdown);
      for (auto& c : self->state.colocators)
        self->send(c, stop_atom::value, why);
      // Colocators escalate to SIGKILL after their job's grace period; this bounds a
      // colocator that does not answer at all.
      self->delayed_send(self, std::chrono::seconds(30), kill_atom::value);
    };
    self->set_default_handler(drop_unexpected);
    // Its agent's threads and actors send as the guardian (post_from); a colocator
    // enlists itself.
    auto from_itself = [=](const char* what) {
      return admitted(self, sent_by_itself(self), "the node's guardian", what);
    };
    return {
        [=](enlist_atom, caf::actor c) {
          if (!admitted(self, sent_by(self, c) && c.node() == self->system().node(),
                        "the node's guardian", "an enlisting of another actor"))
            return;
          self->monitor(c);
          self->state.colocators.push_back(std::move(c));
        },
        [=](shutdown_atom) {
          if (from_itself("a shutdown"))
            stop("the node agent shut down");
        },
        // the node drains or is back: every job with ranks here is told (its colocator
        // passes it on to its driver)
        [=](drain_atom, bool on, const std::string& how) {
          if (!from_itself("a drain"))
            return;
          for (auto& c : self->state.colocators)
            self->send(c, drain_atom::value, on, how);
        },
        [=](shutdown_atom, const std::string& why) {
          if (from_itself("a shutdown"))
            stop(why);
        },
        // a job was cancelled (the ticket checked by the agent; `only`: the owner whose
        // job it is, "" for an administrator): its colocator here, if any, stops its ranks
        // and tells its driver
        [=](cancel_atom, const std::string& job, const std::string& only, const std::string& by) {
          if (!from_itself("a cancel"))
            return;
          for (auto& c : self->state.colocators)
            self->send(c, cancel_atom::value, job, only, by);
        },
        [=](kill_atom) {
          if (from_itself("a kill"))
            self->quit(caf::exit_reason::user_shutdown);
        },
    };
  });
}

} // namespace cafhvd

namespace cafhvd {

namespace {

std::mutex refused_mtx;
std::map<std::string, uint64_t> refused_peers;
refused_listener refused_tell;

// How a refused message's sender is named: its node's certificate where the wire guard
// bound one, else the node.
std::string peer_name(caf::local_actor* self, const caf::strong_actor_ptr& sender) {
  if (!sender)
    return "no sender";
  if (sender->node() == self->system().node())
    return "this process";
  std::string who;
  try {
    who = net::module().peer_of(sender->node());
  } catch (const std::exception&) {
  }
  return who.empty() ? "node " + caf::to_string(sender->node()) : who;
}

} // namespace

std::map<std::string, uint64_t> refused_by_peer() {
  std::lock_guard g{refused_mtx};
  return refused_peers;
}

void on_refused_message(refused_listener listener) {
  std::lock_guard g{refused_mtx};
  refused_tell = std::move(listener);
}

void note_refused(caf::local_actor* self, const char* who, const std::string& what) {
  ++refused_messages;
  auto sender = self->current_sender();
  auto peer = peer_name(self, sender);
  uint64_t count = 0;
  refused_listener tell;
  {
    std::lock_guard g{refused_mtx};
    // bounded: peers beyond the first 256 are counted together
    if (refused_peers.size() >= 256 && !refused_peers.count(peer))
      peer = "other peers";
    count = ++refused_peers[peer];
    tell = refused_tell;
  }
  if (tell)
    tell(peer, fmt::format("{} refused {}", who, what), count);
  static line_budget lines;
  uint64_t left_out = 0;
  if (!lines.take(left_out))
    return;
  std::string from = sender ? caf::to_string(sender->address()) : std::string{"no sender"};
  if (sender && peer != "this process")
    from += ", " + peer;
  std::fprintf(stderr, "caf-hvd: %s refused %s from %s (not its sender's to give)\n", who,
               what.c_str(), from.c_str());
}

caf::result<caf::message> drop_unexpected(caf::scheduled_actor* self, caf::message_view& x) {
  note_refused(self, self->name(), "a message of a type it does not take");
  return caf::drop(self, x);
}

caf::error refused_error(const std::string& what) {
  return caf::make_error(caf::sec::runtime_error,
                         what + ": refused, the sender has no right to it");
}

} // namespace cafhvd
