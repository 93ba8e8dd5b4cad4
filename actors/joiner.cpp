// The joiner (actors/cluster.hpp): an agent started with `--join HOST[:PORT]` joins the
// cluster's table, reports its node, and joins again whenever the table's holder comes back.
#include "actors/cluster.hpp"
#include "actors/cluster_common.hpp"

#include <algorithm>
#include <chrono>
#include <random>
#include <set>

#include <fmt/format.h>

#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "actors/driver_util.hpp"
#include "runtime/network/net.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/observe/text.hpp"

namespace cafhvd {

using namespace cluster_common;

namespace {

// How often a joined agent reports anyway when nothing changed.
constexpr int64_t report_anyway_ms = 5000;

bool same_report(const member_info& a, const member_info& b) {
  auto jobs_equal = [](auto& x, auto& y) {
    if (x.size() != y.size())
      return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].job != y[i].job || x[i].ranks != y[i].ranks || x[i].gpus != y[i].gpus)
        return false;
    return true;
  };
  return a.name == b.name && a.address == b.address && a.port == b.port && a.slots == b.slots
         && a.gpus == b.gpus && a.gpus_free == b.gpus_free && a.labels == b.labels
         && a.draining == b.draining && jobs_equal(a.jobs, b.jobs)
         && a.refused_connections == b.refused_connections
         && a.refused_messages == b.refused_messages;
}


struct joiner_state {
  std::string host;
  uint16_t port = 0;
  bool tls = true;
  std::string target; // host:port
  std::string address; // this agent's address towards the table
  cluster_actor table;
  caf::node_id lost; // the table's node when it was lost: a connect that still names it is
                     // the middleman's stale cache (a request to it would never be answered)
  bool joined = false, ever_joined = false, connecting = false, stopping = false;
  member_info sent;
  int64_t sent_ms = 0;
  int64_t conflict_since = 0; // the name was held by a live agent since
  std::string last_problem;   // said once until it changes
  int attempts = 0;           // failed tries since the last join (the backoff's exponent)
  uint64_t timer = 0;         // its own timer messages carry it
  uint64_t stop_token = 0;    // its agent's "left" carries it
  uint64_t member_token = 0;  // the table's: its news and its leaving carry it
  static inline const char* name = "cluster-joiner";
};

using joiner_ptr = caf::stateful_actor<joiner_state>*;

void report(joiner_ptr self);

// The wait before the next try: 0.25 s doubling up to 4 s, each drawn at random from its
// upper half. Agents that start together (a cluster's reboot) or lose the table together
// spread their tries instead of handshaking with the holder in one herd, which on a small
// machine starved the holder until every handshake timed out and every agent tried again.
std::chrono::milliseconds retry_delay(int attempts) {
  static thread_local std::mt19937 rng{std::random_device{}()};
  int ceiling = std::min(4000, 250 << std::min(attempts, 4));
  return std::chrono::milliseconds(
      std::uniform_int_distribution<int>{ceiling / 2, ceiling}(rng));
}

void give_up(joiner_ptr self, const std::string& why) {
  auto& n = settings_of(self->system());
  if (n.fatal)
    n.fatal(fmt::format("cannot join the cluster at {}: {}", self->state.target, why));
}

// A problem on the way to the table: the first join ends the agent on a definite one,
// later ones are retried (the holder may come back).
void retry(joiner_ptr self, const std::string& why, bool definite) {
  auto& st = self->state;
  st.connecting = false;
  if (definite && !st.ever_joined)
    return give_up(self, why);
  if (why != st.last_problem) {
    say(settings_of(self->system()),
        fmt::format("cannot join the cluster at {} ({}); trying again", st.target, why));
    st.last_problem = why;
  }
  self->delayed_send(self, retry_delay(st.attempts++), deadline_atom::value, uint64_t{1},
                     st.timer);
}

void try_join(joiner_ptr self) {
  auto& st = self->state;
  if (st.joined || st.connecting || st.stopping)
    return;
  st.connecting = true;
  if (auto a = resolve_ipv4(st.host); !a)
    return retry(self, fmt::format("cannot resolve '{}'", st.host), false);
  else if (auto local = local_address_towards(*a))
    st.address = *local;
  auto mm = net::module().connector(self->system(), st.tls);
  self->request(mm, std::chrono::seconds(10), caf::connect_atom::value, st.host, st.port)
      .then(
          [self](caf::node_id& nid, caf::strong_actor_ptr& published, std::set<std::string>&) {
            auto& st = self->state;
            if (st.lost && nid == st.lost)
              return retry(self, "the agent there is the one that was lost (not gone yet)",
                           false);
            auto table = caf::actor_cast<cluster_actor>(published);
            if (!table)
              return retry(self,
                           "the agent there publishes no cluster table (a caf-hvd agent of an "
                           "older version?)",
                           true);
            auto& n = settings_of(self->system());
            auto info = local_member(self->system(), st.address);
            signed_ticket ticket;
            if (n.creds) {
              try {
                ticket = net::module().sign_ticket(
                    *n.creds, ticket_body("join", to_string(nid), n.name, unix_s()));
              } catch (const std::exception& e) {
                return retry(self, e.what(), true);
              }
            }
            self->request(table, std::chrono::seconds(5), join_atom::value,
                          caf::actor_cast<caf::actor>(self), info, ticket)
                .then(
                    [self, table, info](join_answer& answer) {
                      auto& st = self->state;
                      auto& n = settings_of(self->system());
                      auto& why = answer.error;
                      if (!why.empty()) {
                        // A name still held may be this agent's own previous run, not yet
                        // seen as lost: it is tried again for a link timeout and a bit.
                        bool held = why.find("is held by a live agent") != std::string::npos;
                        auto now = unix_ms();
                        if (held && st.conflict_since == 0)
                          st.conflict_since = now;
                        bool definite = !held
                                        || now - st.conflict_since
                                               > n.link_timeout.count() + 2000;
                        return retry(self, "refused: " + why, definite);
                      }
                      st.conflict_since = 0;
                      st.attempts = 0;
                      st.member_token = answer.token;
                      st.connecting = false;
                      st.joined = true;
                      st.table = table;
                      st.sent = info;
                      st.sent_ms = unix_ms();
                      st.last_problem.clear();
                      self->monitor(table);
                      say(n, fmt::format("{} the cluster at {}",
                                         st.ever_joined ? "joined again" : "joined", st.target));
                      st.ever_joined = true;
                      // A drain the table kept while this node was away (the answer to
                      // this agent's own join, from the table it joined)
                      if (answer.drained && !n.draining->load()) {
                        set_draining(n, true, {},
                                     "drained by the cluster's administrator while this node "
                                     "was away (the table kept the drain)");
                        report(self);
                        say(n, "drained by the cluster's administrator while it was away: no "
                               "new jobs; running ranks go on");
                      } else if (answer.undrained && n.draining->load()) {
                        // a drain this agent kept across its restart, ended by an undrain
                        // the table got while it was away
                        set_draining(n, false, {},
                                     "undrained by the cluster's administrator while this node "
                                     "was away");
                        report(self);
                        say(n, "undrained by the cluster's administrator while it was away: it "
                               "takes jobs again");
                      }
                    },
                    [self](caf::error& e) {
                      retry(self, fmt::format("no answer to its join: {}", self->system().render(e)),
                            false);
                    });
          },
          [self](caf::error& e) {
            auto& st = self->state;
            auto why = connect_error(self->system(), e, st.tls, fmt::format("{}:{}", st.host, st.port));
            // Only a peer that is surely not an agent of this cluster ends a first join:
            // nobody listening (yet), no route, a busy agent's slow handshake are waited
            // for.
            bool definite =
                (st.tls
                 && !net::module().tls_failure_for(fmt::format("{}:{}", st.host, st.port)).empty())
                || e == caf::sec::disconnect_during_handshake
                || e == caf::sec::incompatible_application_ids;
            retry(self, why, definite);
          });
}

// Tells the table what changed since the last report (and, every few seconds, that
// nothing did).
void report(joiner_ptr self) {
  auto& st = self->state;
  if (!st.joined)
    return;
  auto info = local_member(self->system(), st.address);
  auto now = unix_ms();
  if (same_report(info, st.sent) && now - st.sent_ms < report_anyway_ms)
    return;
  self->send(st.table, update_atom::value, st.member_token, info);
  st.sent = std::move(info);
  st.sent_ms = now;
}

} // namespace

caf::actor spawn_joiner(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls,
                        uint64_t stop_token) {
  return sys.spawn([host, port, tls, stop_token](
                       caf::stateful_actor<joiner_state>* self) -> caf::behavior {
    auto& st = self->state;
    settings_of(self->system()).jobs->on_change(
        [hdl = caf::actor_cast<caf::actor>(self)] { post_from(hdl, update_atom::value); });
    st.timer = random_token();
    st.stop_token = stop_token;
    self->set_default_handler(drop_unexpected);
    st.host = host;
    st.port = port;
    st.tls = tls;
    st.target = fmt::format("{}:{}", host, port);
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& st = self->state;
      if (dm.source != st.table.address())
        return;
      st.joined = false;
      st.lost = st.table.node();
      st.table = nullptr;
      if (st.stopping)
        return;
      say(settings_of(self->system()),
          fmt::format("lost the cluster's table at {}; joining again", st.target));
      // every member lost it at once: the first tries spread over a quarter second
      self->delayed_send(self, retry_delay(0) / 2, deadline_atom::value, uint64_t{1}, st.timer);
    });
    self->send(self, deadline_atom::value, uint64_t{1}, st.timer);
    self->send(self, deadline_atom::value, uint64_t{2}, st.timer);
    return {
        // 1: try to join; 2: report news (only its own timer: the token)
        [self](deadline_atom, uint64_t what, uint64_t token) {
          auto& st = self->state;
          if (token != st.timer)
            return;
          if (what == 1)
            return try_join(self);
          self->delayed_send(self, report_tick, deadline_atom::value, uint64_t{2}, token);
          report(self);
        },
        // the node's jobs or slots changed (node_book::on_change): report it now, so that
        // the table never places onto a slot a rank took since the last tick
        [self](update_atom) {
          if (admitted(self, sent_by_itself(self), "the cluster joiner", "a report trigger"))
            report(self);
        },
        // An administrator drained (or undrained) this node through the table: the
        // administrator's own ticket, for this node, made for the table it joined.
        [self](drain_atom, bool on, signed_ticket& ticket) {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          if (!admitted(self, st.table && sent_by(self, st.table), "the cluster joiner",
                        "a drain not from its table"))
            return;
          std::string admin = "(insecure)";
          if (n.creds) {
            try {
              if (!st.table)
                throw credentials_error("this agent has not joined");
              auto holder = net::module().check_ticket(*n.creds, ticket, cert_role::admin,
                                                       on ? "drain" : "undrain",
                                                       to_string(st.table.node()));
              if (holder.subject != n.name)
                throw credentials_error("it names another node");
              admin = holder.name;
            } catch (const std::exception& e) {
              say(n, fmt::format("ignored a {} request: {}", on ? "drain" : "undrain", e.what()));
              return;
            }
          }
          set_draining(n, on, admin);
          report(self); // the table's view follows at once, not at the next tick
          say(n, on ? "drained by the cluster's administrator: no new jobs; running ranks go on"
                    : "undrained: it takes jobs again");
        },
        // The job's owner or an administrator cancelled a job through the table: their own
        // ticket, made for the table this agent joined, checked here too.
        [self](cancel_atom, std::string& job, signed_ticket& ticket) {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          if (!admitted(self, st.table && sent_by(self, st.table), "the cluster joiner",
                        "a cancel not from its table"))
            return;
          canceller who;
          try {
            if (!st.table)
              throw credentials_error("this agent has not joined");
            who = check_cancel(n, ticket, to_string(st.table.node()), job);
          } catch (const std::exception& e) {
            say(n, fmt::format("ignored a request to cancel job {}: {}", printable(job), e.what()));
            return;
          }
          post_from(n.guardian, cancel_atom::value, job, who.only, who.by);
        },
        // The agent stops: the table hears it from here, not from a broken link.
        [self](left_atom, uint64_t token) -> caf::result<bool> {
          auto& st = self->state;
          if (token != st.stop_token)
            return false; // not from its agent
          st.stopping = true;
          if (st.joined)
            self->send(st.table, left_atom::value, st.member_token,
                       settings_of(self->system()).name);
          return st.joined;
        },
    };
  });
}

} // namespace cafhvd
