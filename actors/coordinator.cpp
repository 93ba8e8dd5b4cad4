// The coordinator actor (see the header): the job's servers, the workers' registrations,
// assignments, the rank_and_size barrier and Horovod's notification services.
#include "actors/coordinator.hpp"
#include "actors/senders.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "actors/driver_util.hpp"
#include "runtime/network/allowlist.hpp"
#include "runtime/job/elastic.hpp"
#include "runtime/job/generation.hpp"
#include "runtime/horovod/horovod_wire.hpp"
#include "runtime/horovod/rendezvous_server.hpp"
#include "runtime/network/socket_abort.hpp"
#include "runtime/observe/text.hpp"
#include "runtime/torch/torch_store.hpp"

namespace cafhvd {

namespace {

using clock_type = std::chrono::steady_clock;

// deadline_atom kinds (low 4 bits; the rest is a serial number)
enum : uint64_t { dl_barrier = 1, dl_reports = 2, dl_notify = 3 };

// How often a generation's notice is sent again while rank 0 has not acted on it.
constexpr std::chrono::milliseconds notify_resend{1000};

class coordinator : public coordinator_full_actor::base {
public:
  coordinator(caf::actor_config& cfg, coordinator_config config, coordinator_client_actor job)
      : coordinator_full_actor::base(cfg), cfg_(config), job_(std::move(job)) {}

  behavior_type make_behavior() override {
    return {
        [this](report_atom, uint32_t slot, std::string& host) {
          // a worker, or its colocator for a spawn that failed: from the node of the
          // colocator its slot was placed on (checked in on_report), never anonymous
          on_report(slot, host);
        },
        // The job's own interface: from the job actor only (actors/senders.hpp).
        [this](serve_atom, std::string& bind) -> caf::result<served> {
          if (!from_job("serve"))
            return refused_error("serve");
          return serve(bind);
        },
        [this](allow_atom, std::string& host, std::vector<std::string>& addresses, bool local,
               uint32_t rank_uid) {
          if (from_job("allow"))
            allowlist_->add_host(host, addresses, local, rank_uid);
        },
        [this](assign_atom, std::vector<host_slots>& hosts, int32_t min_np,
               int32_t max_np) -> caf::result<assignment> {
          if (!from_job("assign"))
            return refused_error("assign");
          try {
            return assignment{{},
                              get_host_assignments(hosts, min_np,
                                                   max_np > 0 ? std::optional<int>(max_np)
                                                              : std::nullopt)};
          } catch (const std::exception& e) {
            return assignment{e.what(), {}};
          }
        },
        [this](expect_atom, std::vector<uint32_t>& ids, std::string& host,
               caf::node_id& node) -> caf::result<std::vector<std::string>> {
          if (!from_job("expect"))
            return refused_error("expect");
          return expect(std::move(ids), std::move(host), std::move(node));
        },
        [this](barrier_atom, barrier_spec& spec) {
          if (from_job("barrier"))
            on_barrier(std::move(spec));
        },
        [this](lot_atom, uint64_t g) -> caf::result<uint16_t> {
          if (!from_job("lot"))
            return refused_error("lot");
          return open_lot(g);
        },
        [this](parked_atom, uint64_t lot, int32_t rank, std::string& client) {
          if (from_itself("a parked newcomer"))
            on_parked(lot, rank, client);
        },
        [this](release_atom, uint64_t g) {
          if (from_job("release") && g == gen_.number && !gen_.released)
            release();
        },
        [this](leave_atom, std::string& key) {
          if (from_job("leave"))
            leave(key);
        },
        [this](gone_atom, std::string& key) {
          if (from_job("gone"))
            registrations_.erase(key); // its notification service ended with it
        },
        [this](notify_atom, uint64_t g, uint8_t change) {
          if (!from_job("notify") || g != gen_.number)
            return;
          publish_held_update();
          notice_gen_ = g;
          notify_change_ = change;
          notify_ts_ = 0; // a new notice: a new timestamp
          notify_told_ = notify_warned_ = false;
          send_notification();
        },
        [this](stop_atom) {
          if (!from_job("stop"))
            return;
          closed_ = true;
          for (auto& key : gen_.votes)
            answer(key, slot_not_in_job);
          gen_.votes.clear();
        },
        [this](gloo_atom) -> caf::result<gloo_links> {
          if (!from_job("gloo"))
            return refused_error("gloo");
          return links();
        },
        // from the rendezvous server's and the notifications' threads only (they send as
        // this actor; actors/senders.hpp)
        [this](vote_atom, std::string& host, int32_t lr) {
          if (from_itself("a vote"))
            on_vote(host, lr);
        },
        [this](register_atom, std::string& host, int32_t lr, std::string& body) {
          if (from_itself("a registration"))
            on_register(host, lr, body);
        },
        [this](reached_atom, uint64_t store_gen, std::string& scope, int32_t rank, bool connected,
               std::string& client) {
          if (from_itself("a rendezvous progress"))
            on_progress(store_gen, scope, rank, connected, client);
        },
        [this](notified_atom, uint64_t g, std::string& key, std::string& problem) {
          if (!from_itself("a notification result"))
            return;
          notify_in_flight_ = false;
          if (g == notice_gen_
              && (problem.empty() ? !std::exchange(notify_told_, true)
                                  : !std::exchange(notify_warned_, true)))
            send(job_, notified_atom::value, g, key, problem);
          if (!notice_wanted())
            return;
          if (g != notice_gen_)
            return send_notification(); // a newer notice waited for this one
          // Delivered is not acted on: a notice that reaches rank 0 inside reset() is
          // dropped with its queue (Horovod's State.on_reset). Sent again with the same
          // timestamp, it is ignored once seen (check_host_updates keeps newer ones).
          delayed_send(this, notify_resend, deadline_atom::value, dl_notify | (g << 4));
        },
        [this](alive_atom, uint64_t g, std::string& key, uint32_t ms) {
          if (!from_job("alive") || g != gen_.number || gen_.released)
            return;
          auto it = carried_.find(key);
          if (it == carried_.end())
            return;
          it->second.alive = clock_type::now() - std::chrono::milliseconds(ms);
          late_told_.erase(key);
          schedule_barrier_check();
        },
        [this](deadline_atom, uint64_t which) {
          if (from_itself("a deadline"))
            on_deadline(which);
        },
    };
  }

private:
  bool from_itself(const char* what) {
    return admitted(this, sent_by_itself(this), "the coordinator", what);
  }

  bool from_job(const char* what) {
    return admitted(this, sent_by(this, job_), "the coordinator", what);
  }

  template <class... Ts> void log(fmt::format_string<Ts...> f, Ts&&... xs) {
    if (cfg_.verbose)
      write_all(2, fmt::format("caf-hvd [{:>5} ms] coordinator: {}\n",
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   clock_type::now() - cfg_.started)
                                   .count(),
                               fmt::format(f, std::forward<Ts>(xs)...)));
  }

  template <class... Ts> void say(fmt::format_string<Ts...> f, Ts&&... xs) {
    write_all(2, fmt::format("caf-hvd: {}\n", fmt::format(f, std::forward<Ts>(xs)...)));
  }

  void event(const char* name, const nlohmann::json& context) {
    send(job_, event_atom::value, std::string{name}, json_text(context));
  }

  void answer(const std::string& key, const std::string& body) {
    if (server_)
      server_->answer_slot(key, body);
  }

  // -- servers ----------------------------------------------------------------------------

  served serve(const std::string& bind) {
    if (server_)
      return {{}, server_->address(), server_->port(), store_ ? store_->port() : uint16_t{0}};
    auto warn = [](const std::string& what) {
      write_all(2, fmt::format("caf-hvd: warning: {}\n", what));
    };
    try {
      rendezvous_options o;
      o.bind = bind;
      o.allowlist = allowlist_;
      o.on_refused = warn;
      server_ = std::make_unique<rendezvous_server>(o);
    } catch (const std::exception& e) {
      return {e.what(), {}, 0, 0};
    }
    auto hdl = caf::actor_cast<coordinator_full_actor>(this);
    if (cfg_.elastic) {
      server_->enable_elastic(
          [hdl](const std::string& host, int lr) {
            post_from(hdl, vote_atom::value, host, static_cast<int32_t>(lr));
          },
          [hdl](const std::string& host, int lr, const std::string& body) {
            post_from(hdl, register_atom::value, host, static_cast<int32_t>(lr), body);
          });
      server_->set_update(0, "generation 0\nchange none\n");
      server_->on_gloo_progress([hdl](uint64_t store_gen, const std::string& scope, int rank,
                                      bool connected, const std::string& client) {
        post_from(hdl, reached_atom::value, store_gen, scope, static_cast<int32_t>(rank),
                       connected, client);
      });
      server_->on_parked([hdl](uint64_t lot, int rank, const std::string& client) {
        post_from(hdl, parked_atom::value, lot, static_cast<int32_t>(rank), client);
      });
    }
    log("rendezvous server on {}:{}", bind, server_->port());
    event("rendezvous", {{"address", bind}, {"port", server_->port()}});
    // torch's store lives next to it for the whole job, so MASTER_ADDR/PORT outlive any
    // host; each released generation gets a fresh key space (torchrun starts a new store
    // for each restart).
    if (cfg_.torch_store != torch_store_mode::off) {
      try {
        auto job = job_;
        auto me = caf::actor_cast<coordinator_full_actor>(this);
        store_ = std::make_unique<torch_store_server>(
            bind, uint16_t{0},
            [job, me](const std::string& problem) {
              // as the coordinator: the job takes store problems only from it
              caf::send_as(me, job, tstore_atom::value, "on the driver: " + problem);
            },
            torch_store_limits{}, allowlist_, warn);
      } catch (const std::exception& e) {
        server_.reset();
        return {e.what(), {}, 0, 0};
      }
      log("torch store on {}:{}", bind, store_->port());
      event("torch_store", {{"address", bind}, {"port", store_->port()}});
    }
    return {{}, server_->address(), server_->port(), store_ ? store_->port() : uint16_t{0}};
  }

  // The endpoints of the current plan's Gloo connections, and the servers' own.
  gloo_links links() {
    gloo_links l;
    if (!server_)
      return l;
    for (auto& e : server_->gloo_endpoints())
      l.gloo.push_back(e.str());
    auto& a = server_->address();
    auto at = [&](uint16_t port) {
      return a.find(':') == std::string::npos ? fmt::format("{}:{}", a, port)
                                              : fmt::format("[{}]:{}", a, port);
    };
    l.keep.push_back(at(server_->port()));
    if (store_)
      l.keep.push_back(at(store_->port()));
    return l;
  }

  // -- the workers' registrations -----------------------------------------------------------
  // Each worker reports (slot, host) when it starts; the job asks for a batch of slots
  // it placed on one host and hears, per slot, whether its worker runs there.

  struct expectation {
    std::vector<uint32_t> ids;
    std::string host;
    caf::node_id node; // the colocator's: its workers report from there
    caf::typed_response_promise<std::vector<std::string>> rp;
  };

  caf::result<std::vector<std::string>> expect(std::vector<uint32_t> ids, std::string host,
                                               caf::node_id node) {
    auto serial = next_expectation_++;
    auto rp = make_response_promise<std::vector<std::string>>();
    expected_.emplace(serial, expectation{std::move(ids), std::move(host), std::move(node), rp});
    delayed_send(this, cfg_.start_timeout, deadline_atom::value, dl_reports | (serial << 4));
    check_reports(serial, false);
    return rp;
  }

  // A slot's report counts only from the node its colocator runs on (the job asks for the
  // batch before the colocator spawns a worker, so the expectation is always here first);
  // a report of a slot nobody waits for (late, or made up) leaves nothing behind.
  void on_report(uint32_t slot, const std::string& host) {
    auto& sender = current_sender();
    for (auto& [serial, e] : expected_) {
      if (std::find(e.ids.begin(), e.ids.end(), slot) == e.ids.end())
        continue;
      if (!admitted(this, sender && sender->node() == e.node, "the coordinator",
                    fmt::format("a report of slot {}{}", slot,
                                sender ? " placed on another node" : "")))
        return;
      reports_[slot] = host;
      return check_reports(serial, false);
    }
  }

  // Answers the batch once every worker reported, or at its deadline.
  void check_reports(uint64_t serial, bool deadline) {
    auto it = expected_.find(serial);
    if (it == expected_.end())
      return;
    auto& e = it->second;
    std::vector<std::string> out;
    for (auto id : e.ids) {
      auto r = reports_.find(id);
      if (r == reports_.end()) {
        if (!deadline)
          return; // still waiting
        out.push_back(fmt::format("its worker did not report its host within {} s "
                                  "(--start-timeout)",
                                  cfg_.start_timeout.count() / 1000.0));
        continue;
      }
      out.push_back(r->second == e.host
                        ? std::string{}
                        : fmt::format("its worker reports host '{}' but the slot was placed on "
                                      "'{}'",
                                      r->second, e.host));
    }
    for (auto id : e.ids)
      reports_.erase(id);
    e.rp.deliver(std::move(out));
    expected_.erase(it);
  }

  // -- the barrier ---------------------------------------------------------------------------
  // A forming generation is released when every process it carries over voted with
  // GET /rank_and_size/<host>:<lr>; fresh slots never vote (their processes start at the
  // release with the released plan in their environment).

  void on_barrier(barrier_spec spec) {
    auto old_votes = std::move(gen_.votes);
    gen_ = generation{spec.number, std::move(spec.plan), clock_type::now()};
    gen_.fresh.insert(spec.fresh.begin(), spec.fresh.end());
    carried_.clear();
    late_told_.clear();
    for (auto& c : spec.carried)
      carried_[c.key] = slot_process{c.key, c.host,
                                     clock_type::time_point{std::chrono::nanoseconds{c.started_ns}},
                                     c.joined, true};
    for (auto& [key, row] : gen_.rows)
      left_.erase(key);
    barrier_check_.reset();
    // Votes that wait for this generation carry over; the others are answered -1.
    for (auto& key : old_votes) {
      if (carried_.count(key))
        gen_.votes.insert(key);
      else
        answer(key, slot_not_in_job);
    }
    // The lots of plans that will not run close (the job stops their newcomers).
    for (auto it = lots_.begin(); it != lots_.end();)
      if (*it != gen_.number && !released_lots_.count(*it)) {
        if (server_)
          server_->close_lot(*it);
        it = lots_.erase(it);
      } else {
        ++it;
      }
    held_update_.reset();
    if (cfg_.elastic && server_) {
      if (spec.hold_update)
        held_update_ = std::make_pair(gen_.number, spec.update); // told with the notice
      else
        server_->set_update(gen_.number, spec.update);
    }
    if (spec.resume) { // the running ranks go on: nothing of the servers changes
      gen_.released = true;
      released_plan_ = gen_.plan;
      return;
    }
    if (spec.release_now)
      return release();
    schedule_barrier_check();
    check_complete();
  }

  void on_vote(const std::string& host, int32_t lr) {
    auto key = slot_key(host, lr);
    // A slot votes when a process of it runs in the job: one the forming plan carries
    // over, or any of the released plan (it asks for the next generation). A fresh slot
    // of a forming plan has no process yet (it starts with the release).
    bool member = !closed_ && gen_.has(key) && !left_.count(key)
                  && (gen_.released || carried_.count(key) > 0);
    if (!member) {
      log("vote of {} which is not in generation {}: answered -1", key, gen_.number);
      return answer(key, slot_not_in_job);
    }
    if (!gen_.released) {
      if (gen_.votes.insert(key).second)
        log("vote of {} for generation {} ({} of {})", key, gen_.number, gen_.votes.size(),
            carried_.size());
      if (!gen_.first_vote) {
        gen_.first_vote = clock_type::now();
        schedule_barrier_check();
      }
      return check_complete();
    }
    // It already joined this generation: it asks for the next one (it saw a failure).
    gen_.votes.insert(key);
    send(job_, rejoin_atom::value, key);
  }

  void check_complete() {
    if (gen_.released || closed_ || !gen_.complete())
      return;
    log("generation {}: all {} ranks it carries over joined", gen_.number, carried_.size());
    send(job_, complete_atom::value, gen_.number);
  }

  // -- warm joins ------------------------------------------------------------------------
  // A forming generation's newcomers start before its release and wait at its lot: a
  // port of the rendezvous server whose requests are held, unread by the store, until
  // the release (runtime/horovod/rendezvous_server.hpp).

  uint16_t open_lot(uint64_t g) {
    if (!server_ || !cfg_.elastic || g != gen_.number || gen_.released)
      return 0;
    try {
      auto port = server_->open_lot(g);
      lots_.insert(g);
      log("generation {}: newcomers wait at port {}", g, port);
      return port;
    } catch (const std::exception& e) {
      say("warning: {}; generation {}'s newcomers start at its release", e.what(), g);
      return 0;
    }
  }

  void on_parked(uint64_t lot, int32_t rank, const std::string& client) {
    if (lot != gen_.number || gen_.released || closed_)
      return;
    for (auto& row : gen_.plan)
      if (row.rank == rank) {
        if (!speaks_for_rank(row.hostname, client,
                             fmt::format("waits at generation {}'s lot as "
                                         "rank {}",
                                         lot, rank)))
          return;
        return send(job_, parked_atom::value, lot, slot_key(row.hostname, row.local_rank));
      }
  }

  // Whether a rendezvous request from `client` may stand for a rank of `host` in the
  // job's account of the rendezvous (which ranks began or finished it, which newcomers
  // wait): another host's process, or anyone the allowlist admits, would otherwise make
  // the job release a plan before its newcomer came or judge a rank by a step it never
  // took. Said once per address and host.
  bool speaks_for_rank(const std::string& host, const std::string& client,
                       const std::string& what) {
    if (allowlist_->speaks_for(host, client))
      return true;
    if (allowlist_->first_refusal("rendezvous progress", client + " " + host))
      say("warning: a client at {} {} of host {}, and is not that host: ignored", client, what,
          host);
    event("rendezvous.refused", {{"client", client}, {"host", host}, {"what", what}});
    return false;
  }

  void publish_held_update() {
    if (held_update_ && held_update_->first == gen_.number && server_)
      server_->set_update(held_update_->first, held_update_->second);
    held_update_.reset();
  }

  // The plan becomes the servers': the store gets a fresh key space, held votes are
  // answered with their places.
  void release() {
    publish_held_update();
    gen_.released = true;
    gen_.votes.clear();
    barrier_check_.reset();
    if (cfg_.elastic && store_ && gen_.number > 1)
      store_->clear(); // before anyone learns its rank in the new plan
    released_plan_ = gen_.plan;
    if (!server_)
      return;
    if (cfg_.elastic)
      server_->release(gen_.plan);
    else
      server_->init(gen_.plan);
    // the store's generations count its plans: its progress reports name one
    store_plans_[++store_gen_] = {gen_.number, gen_.plan};
    // its newcomers' held requests are served now, by the new plan's store
    if (lots_.count(gen_.number)) {
      released_lots_.insert(gen_.number);
      server_->release_lot(gen_.number);
    }
    while (store_plans_.size() > 4) {
      auto dropped = store_plans_.begin()->first;
      store_plans_.erase(store_plans_.begin());
      // its reports are dropped from now on: what was heard of it is not needed either
      progress_heard_.erase(progress_heard_.begin(),
                            progress_heard_.lower_bound({dropped + 1, std::string{}, 0, false}));
    }
  }

  // A rank of a served plan began (or finished) its Gloo rendezvous: the job hears it
  // by the slot's key. Reports of a plan replaced long ago are dropped.
  void on_progress(uint64_t store_gen, const std::string& scope, int32_t rank, bool connected,
                   const std::string& client) {
    auto it = store_plans_.find(store_gen);
    if (it == store_plans_.end())
      return;
    auto& [number, plan] = it->second;
    bool cross = scope != "global";
    int lr = -1;
    if (cross) { // cross_<local_rank>: the rank is the cross rank
      auto digits = scope.substr(6);
      if (digits.empty() || digits.size() > 6
          || !std::all_of(digits.begin(), digits.end(),
                          [](char c) { return c >= '0' && c <= '9'; }))
        return;
      lr = std::stoi(digits);
    }
    auto row = std::find_if(plan.begin(), plan.end(), [&](auto& r) {
      return cross ? r.local_rank == lr && r.cross_rank == rank : r.rank == rank;
    });
    if (row == plan.end()
        || !speaks_for_rank(row->hostname, client,
                            fmt::format("{} the rendezvous of scope {} as rank {}",
                                        connected ? "finished" : "began", scope, rank))
        || !progress_heard_.insert({store_gen, scope, rank, connected}).second)
      return;
    send(job_, reached_atom::value, number, slot_key(row->hostname, row->local_rank), cross,
         connected);
  }

  // The slot is not in the job any more: a held vote is answered -1, later ones too
  // until a generation takes it again.
  void leave(const std::string& key) {
    answer(key, slot_not_in_job);
    gen_.votes.erase(key);
    left_.insert(key);
  }

  join_deadline deadline_of(const std::string& key) {
    auto it = carried_.find(key);
    return it == carried_.end()
               ? join_deadline{}
               : deadline_for(gen_, it->second, cfg_.start_timeout, cfg_.elastic_timeout);
  }

  // Arms one check for the earliest join deadline of the forming generation.
  void schedule_barrier_check() {
    if (gen_.released || closed_)
      return;
    std::optional<clock_type::time_point> next;
    for (auto& key : gen_.missing())
      if (auto d = deadline_of(key);
          d.kind != deadline_kind::none && !late_told_.count(key) && (!next || d.at < *next))
        next = d.at;
    if (!next || (barrier_check_ && *barrier_check_ <= *next))
      return;
    barrier_check_ = next;
    auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(*next - clock_type::now());
    delayed_send(this, std::max(delay, std::chrono::milliseconds(0)) + std::chrono::milliseconds(1),
                 deadline_atom::value, dl_barrier | (gen_.number << 4));
  }

  void on_deadline(uint64_t which) {
    auto kind = which & 0xf;
    auto serial = which >> 4;
    if (kind == dl_reports)
      return check_reports(serial, true);
    if (kind == dl_notify) {
      if (serial == notice_gen_ && notice_wanted())
        send_notification();
      return;
    }
    if (kind != dl_barrier || serial != gen_.number)
      return;
    barrier_check_.reset();
    if (gen_.released || closed_)
      return;
    auto now = clock_type::now();
    std::vector<std::string> fresh, carrying;
    for (auto& key : gen_.missing()) {
      auto d = deadline_of(key);
      if (d.kind == deadline_kind::none || now < d.at || left_.count(key) || late_told_.count(key))
        continue;
      (d.kind == deadline_kind::fresh ? fresh : carrying).push_back(key);
    }
    // each is told once; a carrying slot the job finds alive comes back with alive_atom
    late_told_.insert(fresh.begin(), fresh.end());
    late_told_.insert(carrying.begin(), carrying.end());
    if (!fresh.empty() || !carrying.empty())
      send(job_, late_atom::value, gen_.number, std::move(fresh), std::move(carrying));
    schedule_barrier_check();
  }

  // -- Horovod's worker notification services --------------------------------------------
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
      event("notify.refused", {{"slot", key}, {"cause", reg.error}});
      return;
    }
    auto where = to_string(*reg.value);
    log("{} registered its notification service at {}", key, where);
    event("notify.registered", {{"slot", key}, {"addresses", where}});
    registrations_[key] = std::move(*reg.value);
    if (key == released_rank0())
      send_notification();
  }

  // The slot of rank 0 of the last released plan ("" if none).
  std::string released_rank0() const {
    for (auto& row : released_plan_)
      if (row.rank == 0)
        return slot_key(row.hostname, row.local_rank);
    return {};
  }

  // Whether rank 0 of the released plan still has to act on the forming generation's
  // notice: it has not voted in it (its vote says it re-joins), and no release came.
  bool notice_wanted() const {
    auto key = released_rank0();
    return !closed_ && !gen_.released && notice_gen_ == gen_.number && !key.empty()
           && !gen_.votes.count(key);
  }

  // Rank 0 of the released plan is told even when its own host leaves the plan: its
  // process runs until it re-joins (and is answered -1), and only its notice makes the
  // others re-join at a commit instead of losing their steps to its end.
  void send_notification() {
    auto key = released_rank0();
    if (!notice_wanted() || notify_in_flight_)
      return;
    auto it = registrations_.find(key);
    if (it == registrations_.end()) {
      // Sent when it registers (a Horovod worker does so in hvd.elastic.run).
      log("rank 0 ({}) has no notification service yet; running ranks learn of generation {} "
          "through /elastic/update, or when it registers",
          key, gen_.number);
      return;
    }
    // Horovod's workers keep only updates newer than the last one (whole seconds); a
    // notice sent again keeps its timestamp.
    if (notify_ts_ == 0) {
      auto now = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
      last_notify_ts_ = std::max<int64_t>(now, last_notify_ts_ + 1);
      notify_ts_ = last_notify_ts_;
    }
    notify_in_flight_ = true;
    auto hdl = caf::actor_cast<coordinator_full_actor>(this);
    std::thread{[hdl, reg = it->second, ts = notify_ts_,
                 res = static_cast<unsigned>(notify_change_), g = gen_.number, key] {
      auto r = notify_hosts_updated(reg, ts, res, std::chrono::milliseconds(3000));
      post_from(hdl, notified_atom::value, g, key, r.ok ? std::string{} : to_string(r));
    }}.detach();
  }

  coordinator_config cfg_;
  coordinator_client_actor job_;
  std::shared_ptr<address_allowlist> allowlist_ = std::make_shared<address_allowlist>();
  std::unique_ptr<rendezvous_server> server_;
  std::unique_ptr<torch_store_server> store_;

  std::map<uint32_t, std::string> reports_; // slot id -> the host its worker reported
  std::map<uint64_t, expectation> expected_;
  uint64_t next_expectation_ = 1;

  generation gen_;                              // the newest generation (released or forming)
  std::map<std::string, slot_process> carried_; // ... the processes it waits for
  std::set<std::string> late_told_;             // ... those the job was told are late
  std::set<std::string> left_;                  // slots the job let go
  std::optional<clock_type::time_point> barrier_check_;
  std::vector<slot_info> released_plan_;
  bool closed_ = false;
  std::set<std::tuple<uint64_t, std::string, int32_t, bool>> progress_heard_; // told the job
  std::set<uint64_t> lots_, released_lots_; // warm joins: generations' lots, those in use
  std::optional<std::pair<uint64_t, std::string>> held_update_; // /elastic/update, with the notice
  uint64_t store_gen_ = 0; // plans given to the rendezvous store, and the last few of them
  std::map<uint64_t, std::pair<uint64_t, std::vector<slot_info>>> store_plans_;

  std::map<std::string, worker_registration> registrations_;
  uint64_t notice_gen_ = 0; // the generation whose notice rank 0 is to act on
  uint8_t notify_change_ = 0;
  int64_t last_notify_ts_ = 0;
  int64_t notify_ts_ = 0;         // the pending notice's timestamp (0: not sent yet)
  bool notify_in_flight_ = false; // a send has not returned yet
  bool notify_told_ = false;      // the job heard of a delivery of this notice
  bool notify_warned_ = false;    // ... of a failed one
};

} // namespace

coordinator_full_actor spawn_coordinator(caf::actor_system& sys, coordinator_config config,
                                         coordinator_client_actor job) {
  return sys.spawn<coordinator>(std::move(config), std::move(job));
}

} // namespace cafhvd
