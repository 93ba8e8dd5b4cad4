// The table actor (actors/cluster.hpp), and what it shares with the joiner
// (actors/cluster_common.hpp).
#include "actors/cluster.hpp"
#include "actors/cluster_common.hpp"
#include "runtime/cluster/agent_state.hpp"

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <map>
#include <set>
#include <random>
#include <unistd.h>

#include <fmt/format.h>

#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "actors/driver_util.hpp"
#include "runtime/network/net.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/observe/text.hpp"

namespace cafhvd {

namespace cluster_common {

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

long unix_s() { return static_cast<long>(unix_ms() / 1000); }

uint64_t random_token() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  uint64_t t = 0;
  while (t == 0)
    t = rng();
  return t;
}

void say(const node_settings& n, const std::string& line) {
  std::fprintf(stderr, "caf-hvd node '%s': %s\n", n.name.c_str(), line.c_str());
}

// This node drains (or is back): it takes no new jobs, and every job with ranks here is
// told (elastic jobs leave it; a static job's ranks run on). The drain is also kept in
// the agent's state directory, so that the agent comes back drained after a restart (a
// rolling upgrade's step) until an undrain.
void set_draining(const node_settings& n, bool on, const std::string& admin,
                  const std::string& how) {
  auto what = how.empty() ? fmt::format("{} by the cluster's administrator '{}'",
                                        on ? "drained" : "undrained", printable(admin))
                          : how;
  if (!n.state_dir.empty())
    if (auto why = write_drain_mark(n.state_dir, on, fmt::format("{} at {} (unix time)", what,
                                                                 unix_ms() / 1000));
        !why.empty())
      say(n, fmt::format("warning: the {} is not kept across a restart: {}",
                         on ? "drain" : "undrain", why));
  if (n.draining->exchange(on) == on)
    return;
  if (n.guardian)
    post_from(n.guardian, drain_atom::value, on, what);
}

// A cancel's ticket as a node or the table checks it, for the table at `audience`: an
// administrator's ticket, or a driver's for its own job. Throws saying why not.
canceller check_cancel(const node_settings& n, const signed_ticket& ticket,
                       const std::string& audience, const std::string& job) {
  if (!n.creds)
    return {"(insecure)", {}};
  ticket_holder holder;
  bool admin = true;
  try {
    holder = net::module().check_ticket(*n.creds, ticket, cert_role::admin, "cancel", audience);
  } catch (const std::exception&) {
    admin = false; // then it must be the owner's (that check says why not)
    holder = net::module().check_ticket(*n.creds, ticket, cert_role::driver, "cancel", audience);
  }
  if (holder.subject != job)
    throw credentials_error("it names another job");
  if (admin)
    return {fmt::format("'{}' (administrator)", printable(holder.name)), {}};
  return {fmt::format("'{}' (its owner)", printable(holder.name)), holder.name};
}

} // namespace cluster_common

using namespace cluster_common;

namespace {

// Rows of agents that are gone stay visible this long (status says lost or left).
constexpr int64_t keep_gone_ms = 10 * 60 * 1000;

// The address this agent is reached at when it holds the table itself.
std::string own_address(const node_settings& n) {
  if (!n.bind.empty() && n.bind != "0.0.0.0")
    return n.bind;
  for (auto& a : list_interfaces())
    if (!a.loopback)
      return a.address;
  return "127.0.0.1";
}

// -- the table ---------------------------------------------------------------------------

struct table_state {
  membership_table table;
  struct member {
    caf::actor joiner; // monitored: its end is the member's loss
    uint64_t token = 0; // given at its join; its news and its leaving carry it
  };
  std::map<uint64_t, member> members; // by the id the table knows them by
  std::map<uint64_t, uint64_t> by_token;
  uint64_t next_member = 1;
  uint64_t timer = random_token(); // only its own timer messages carry it
  std::string join_target;
  // drivers that hold placed jobs: (owner, job) each
  std::map<caf::actor_addr, std::set<std::pair<std::string, std::string>>> placers;
  // Elastic jobs that asked for their hosts (admitted by their tickets), monitored: each is
  // nudged as soon as what it would get changes, so a joining or drained node reaches it
  // at once rather than at its next discovery.
  struct watcher {
    caf::strong_actor_ptr job_actor;
    placement_request asked; // its job, labels and what a rank needs
    std::string last;        // what it got, as text
    std::string owner;       // its driver certificate's name (its growth hold's owner)
  };
  std::map<caf::actor_addr, watcher> watchers;
  uint64_t nudges = 0;
  std::vector<std::string> members_kept; // as last written to the state directory
  std::string placements_kept;           // ditto
  void forget(uint64_t id) {
    if (auto m = members.find(id); m != members.end()) {
      by_token.erase(m->second.token);
      members.erase(m);
    }
  }
  static inline const char* name = "cluster-table";
};

constexpr uint64_t self_member = 0; // the holder's own row
constexpr size_t max_watchers = 4096; // elastic jobs the table tells of changes

std::string hosts_text(const std::vector<placed_host>& hosts) {
  std::string text;
  for (auto& h : hosts)
    text += fmt::format("{} {}:{} {}\n", h.name, h.address, h.port, h.slots);
  return text;
}

using table_ptr = cluster_actor::stateful_pointer<table_state>;

// How long a table that starts waits for the members of a table it replaces (its agent
// restarted) before its answers are final: a few of their retry periods (0.25 s doubling
// to 4 s).
constexpr int64_t rejoin_grace_ms = 10'000;

// The members, in the state directory for a table that restarts (once the last table's
// have joined again or the grace ended): at each join, and at the tick for the rest.
void keep_members(table_ptr self) {
  auto& n = settings_of(self->system());
  auto& st = self->state;
  if (n.state_dir.empty() || !st.table.rejoining(unix_ms()).empty())
    return;
  auto names = st.table.member_names();
  names.erase(std::remove(names.begin(), names.end(), n.name), names.end());
  if (names == st.members_kept)
    return;
  if (auto why = write_table_members(n.state_dir, names); !why.empty())
    say(n, fmt::format("warning: the table's members are not kept for its restart: {}", why));
  st.members_kept = std::move(names);
}

// What placement holds (held slots, the waiting line), in the state directory for a table
// that restarts: written whenever it changed, after a placement and at each tick.
void keep_placements(table_ptr self) {
  auto& n = settings_of(self->system());
  auto& st = self->state;
  if (n.state_dir.empty())
    return;
  auto text = st.table.placements_text();
  if (text == st.placements_kept)
    return;
  if (auto why = write_table_placements(n.state_dir, text); !why.empty())
    say(n, fmt::format("warning: the table's placements are not kept for its restart: {}", why));
  st.placements_kept = std::move(text);
}

// Nudges every watching job whose hosts differ from what it got last (it asks again with
// its ticket; a nudge carries nothing else).
void nudge_watchers(table_ptr self) {
  auto& st = self->state;
  if (st.watchers.empty())
    return;
  auto now = unix_ms();
  for (auto& [addr, w] : st.watchers) {
    auto text = hosts_text(st.table.available(w.asked, now));
    if (text == w.last)
      continue;
    w.last = std::move(text);
    send_from(self, caf::actor_cast<caf::actor>(w.job_actor), discover_atom::value, ++st.nudges);
  }
}


// Whether the message `self` handles comes from member `id`'s own joiner (its token is a
// secret of their connection; the sender is checked too).
bool from_member(table_ptr self, uint64_t id, const char* what) {
  auto m = self->state.members.find(id);
  return admitted(self, m != self->state.members.end() && sent_by(self, m->second.joiner),
                  "the cluster's table", what);
}

// Whether this agent holds the table and `ticket` is a `role` ticket for `purpose` at this
// node naming `subject`: "" (and the signer's name in `signer`) or the refusal to answer.
std::string admit(table_ptr self, const signed_ticket& ticket, cert_role role,
                  const char* purpose, const std::string& subject, const char* what,
                  std::string* signer = nullptr) {
  auto& n = settings_of(self->system());
  if (!self->state.join_target.empty())
    return fmt::format("the agent '{}' holds no table: it joined the cluster at {}", n.name,
                       self->state.join_target);
  if (!n.creds)
    return {};
  try {
    auto holder = net::module().check_ticket(*n.creds, ticket, role, purpose,
                                             to_string(self->system().node()));
    if (holder.subject != subject)
      throw credentials_error(fmt::format("it names another {}", what));
    if (signer)
      *signer = holder.name;
  } catch (const std::exception& e) {
    return fmt::format("the agent refused the request: {}", e.what());
  }
  return {};
}

} // namespace

member_info local_member(caf::actor_system& sys, const std::string& address) {
  auto& n = settings_of(sys);
  member_info m;
  m.name = n.name;
  m.address = address;
  m.port = n.port;
  m.slots = n.slots;
  m.cpus = static_cast<uint32_t>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  m.gpus = n.gpus->devices();
  m.gpus_free = n.gpus->free();
  m.labels = n.labels;
  m.started_ms = n.started_ms;
  m.jobs = n.jobs->snapshot();
  m.draining = n.draining->load();
  try {
    m.refused_connections = net::module().wire_refusals();
  } catch (const std::exception&) {
  }
  m.refused_messages = refused_by_peer();
  m.refused_messages.erase("this process");
  return m;
}

cluster_actor spawn_cluster_table(caf::actor_system& sys, const std::string& join_target) {
  return sys.spawn([join_target](cluster_actor::stateful_pointer<table_state> self)
                       -> cluster_actor::behavior_type {
    auto& st = self->state;
    st.join_target = join_target;
    auto node_id = to_string(self->system().node());
    auto refresh_self = [self] {
      if (!self->state.join_target.empty())
        return;
      auto& n = settings_of(self->system());
      auto info = local_member(self->system(), own_address(n));
      if (!self->state.table.update(self_member, info, unix_ms())) {
        ticket_holder me;
        me.name = info.name;
        self->state.table.join(self_member, info, me, unix_ms());
      }
    };
    refresh_self();
    // A table whose agent restarted (its state directory lists the members it had): they
    // join again within a few of their retry periods (at most 4 s apart). Until they all
    // have, or the grace ends, a job that does not fit waits, and elastic jobs keep their
    // host sets, instead of taking a half-filled table for the cluster.
    if (auto& n = settings_of(self->system()); !n.state_dir.empty()) {
      auto had = read_table_members(n.state_dir);
      had.erase(std::remove(had.begin(), had.end(), n.name), had.end());
      st.members_kept = had;
      if (!had.empty())
        st.table.rejoin_until(unix_ms() + rejoin_grace_ms, unix_ms(), std::move(had));
      // slots held for placed jobs and the waiting line, as the last table left them
      if (auto kept = read_table_placements(n.state_dir); !kept.empty()) {
        try {
          st.table.restore_placements(kept, unix_ms());
          st.placements_kept = kept;
        } catch (const std::exception& e) {
          say(n, fmt::format("warning: {}/placements: {}; the table starts with no holds",
                             n.state_dir, e.what()));
        }
      }
    }
    self->set_default_handler(drop_unexpected);
    self->send(self, deadline_atom::value, st.timer);
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& st = self->state;
      if (auto p = st.placers.find(dm.source); p != st.placers.end()) {
        for (auto& [owner, job] : p->second)
          st.table.release(job, owner);
        st.placers.erase(p);
      }
      if (auto w = st.watchers.find(dm.source); w != st.watchers.end()) {
        // its driver is gone: the slots held for its growth are free now
        st.table.release(w->second.asked.job, w->second.owner);
        st.watchers.erase(w);
      }
      std::vector<uint64_t> lost;
      for (auto& [id, m] : st.members)
        if (m.joiner.address() == dm.source)
          lost.push_back(id);
      for (auto id : lost) {
        for (auto& name : st.table.gone(id, false, unix_ms()))
          say(settings_of(self->system()),
              fmt::format("node '{}' is lost (its link broke)", printable(name)));
        st.forget(id);
      }
      nudge_watchers(self);
    });
    return {
        [self, node_id](join_atom, caf::actor& joiner, member_info& info,
                        signed_ticket& ticket) -> join_answer {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          auto refuse = [](std::string why) { return join_answer{std::move(why), 0}; };
          if (!st.join_target.empty())
            return refuse(fmt::format("the agent '{}' holds no table: it joined the cluster at "
                                      "{}; join that one",
                                      n.name, st.join_target));
          if (!joiner)
            return refuse("no joiner given");
          // the joiner is the actor that asks (a peer cannot name another's)
          if (!admitted(self, sent_by(self, joiner), "the cluster's table",
                        "a join naming another actor as its joiner"))
            return refuse("the joiner named is not the actor that asks");
          ticket_holder holder;
          if (n.creds) {
            try {
              holder = net::module().check_ticket(*n.creds, ticket, cert_role::node, "join",
                                                  node_id);
            } catch (const std::exception& e) {
              say(n, fmt::format("refused a join as '{}': {}", printable(info.name), e.what()));
              return refuse(fmt::format("the join ticket was refused: {}", e.what()));
            }
            if (holder.subject != info.name) {
              say(n, fmt::format("refused a join as '{}': its ticket names '{}'",
                                 printable(info.name), printable(holder.subject)));
              return refuse("the join ticket names another node");
            }
          } else {
            holder.shared = true; // --insecure: nothing proves a name
          }
          try {
            info.labels = parse_labels(info.labels);
          } catch (const std::exception& e) {
            return refuse(e.what());
          }
          // Every join is a member of its own (a joiner handle proves nothing: a peer can
          // name another's), known by the token it gets back.
          auto id = st.next_member++;
          auto why = st.table.join(id, info, holder, unix_ms());
          if (!why.empty()) {
            say(n, fmt::format("refused a join as '{}': {}", printable(info.name), why));
            return refuse(why);
          }
          auto token = random_token();
          st.members[id] = {joiner, token};
          st.by_token[token] = id;
          self->monitor(joiner);
          say(n, fmt::format("node '{}' joined from {}:{}{}", printable(info.name),
                             printable(info.address), info.port,
                             holder.shared ? " (a shared certificate)" : ""));
          nudge_watchers(self);
          keep_members(self);
          return join_answer{{}, token, st.table.drained(info.name),
                             st.table.undrained(info.name)};
        },
        [self](update_atom, uint64_t token, member_info& info) {
          auto& st = self->state;
          auto it = st.by_token.find(token);
          if (it == st.by_token.end())
            return; // not joined (or lost meanwhile): its joiner joins again
          if (!from_member(self, it->second, "a member's news"))
            return;
          try {
            info.labels = parse_labels(info.labels);
          } catch (const std::exception&) {
            return;
          }
          st.table.update(it->second, info, unix_ms());
          nudge_watchers(self);
        },
        [self](left_atom, uint64_t token, const std::string& name) {
          auto& st = self->state;
          auto it = st.by_token.find(token);
          if (it == st.by_token.end())
            return;
          if (!from_member(self, it->second, "a member's leaving"))
            return;
          auto id = it->second;
          st.table.gone(id, true, unix_ms());
          say(settings_of(self->system()),
              fmt::format("node '{}' left (its agent stops)", printable(name)));
          st.forget(id);
          nudge_watchers(self);
        },
        [self, node_id, refresh_self](table_atom,
                                      signed_ticket& ticket) -> caf::result<cluster_view> {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          if (n.creds) {
            try {
              net::module().check_ticket(*n.creds, ticket, cert_role::driver, "status", node_id);
            } catch (const std::exception& e) {
              return caf::make_error(caf::sec::request_receiver_down,
                                     fmt::format("the agent refused the request: {}", e.what()));
            }
          }
          cluster_view v;
          v.holder = n.name;
          if (!st.join_target.empty()) {
            v.redirect = st.join_target;
            return v;
          }
          refresh_self();
          auto t = st.table.view(unix_ms());
          t.holder = n.name;
          return t;
        },
        [self, node_id, refresh_self](place_atom, placement_request& r,
                                      signed_ticket& ticket) -> placement {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          placement p;
          std::string owner;
          p.error = admit(self, ticket, cert_role::driver, "place", r.job, "job", &owner);
          if (!p.error.empty())
            return p;
          if (!valid_host_name(r.job)) {
            p.error = "the job id is not one";
            return p;
          }
          try {
            r.labels = parse_labels(r.labels);
          } catch (const std::exception& e) {
            p.error = e.what();
            return p;
          }
          refresh_self();
          // A driver asks to hold slots for at most an hour before its ranks run.
          r.hold_ms = std::min<uint32_t>(r.hold_ms, 3'600'000);
          p = st.table.place(r, unix_ms(), owner);
          for (auto& h : p.hosts)
            h.holder = h.name == n.name;
          if (!p.hosts.empty()) {
            auto driver = caf::actor_cast<caf::actor_addr>(self->current_sender());
            if (driver) {
              auto [it, fresh] = st.placers.try_emplace(driver);
              it->second.emplace(owner, r.job);
              if (fresh)
                self->monitor(driver);
            }
            std::string where;
            for (auto& h : p.hosts)
              where += fmt::format("{}{}:{}", where.empty() ? "" : ",", h.name, h.slots);
            say(n, fmt::format("placed job {} ({} rank{}): {}", r.job, r.np, r.np == 1 ? "" : "s",
                               where));
          }
          nudge_watchers(self); // placed or waiting: elastic jobs may grow less
          keep_placements(self);
          return p;
        },
        [self, node_id, refresh_self](discover_atom, placement_request& r,
                                      signed_ticket& ticket) -> placement {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          placement p;
          std::string owner;
          p.error = admit(self, ticket, cert_role::driver, "discover", r.job, "job", &owner);
          if (!p.error.empty())
            return p;
          try {
            r.labels = parse_labels(r.labels);
          } catch (const std::exception& e) {
            p.error = e.what();
            return p;
          }
          refresh_self();
          p.hosts = st.table.available(r, unix_ms());
          // not final while members join again: a job that has hosts keeps them
          if (auto why = st.table.rejoining(unix_ms()); !why.empty()) {
            p.waiting = true;
            p.waiting_for = why;
          }
          // (a bounded number: beyond it, a job learns of changes at its next discovery)
          if (auto sender = self->current_sender();
              sender && (st.watchers.size() < max_watchers
                         || st.watchers.count(caf::actor_cast<caf::actor_addr>(sender)))) {
            auto addr = caf::actor_cast<caf::actor_addr>(sender);
            auto [it, fresh] = st.watchers.try_emplace(addr);
            // (an answer that is not final yet: the job is nudged once the window ends)
            it->second = {sender, r, p.waiting ? std::string{"(rejoining)"} : hosts_text(p.hosts),
                          owner};
            if (fresh)
              self->monitor(addr);
          }
          // The free slots it was told are its own for a moment: a job that asks next is
          // not told them too, nor placed on them (both would plan ranks there; one would
          // be refused). Also while members join again: a job's first discovery uses
          // that answer (cluster_chaos.py found a static job placed on slots a new elastic
          // job had just been told of, then refused by the node).
          st.table.hold_growth(r, p.hosts, unix_ms(), owner);
          nudge_watchers(self);
          for (auto& h : p.hosts)
            h.holder = h.name == n.name;
          return p;
        },
        [self, node_id, refresh_self](drain_atom, std::string& name, bool on,
                                      signed_ticket& ticket) -> std::string {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          std::string admin = "(insecure)";
          if (auto why = admit(self, ticket, cert_role::admin, on ? "drain" : "undrain", name,
                               "node", &admin);
              !why.empty())
            return why;
          refresh_self();
          if (auto why = st.table.set_drained(name, on); !why.empty())
            return why;
          // The node itself stops taking jobs (and says so in its reports, so a table
          // rebuilt from re-joins knows it too).
          if (name == n.name)
            set_draining(n, on, admin);
          else if (auto m = st.table.member_of(name))
            if (auto j = st.members.find(*m); j != st.members.end())
              // the node checks the administrator's ticket itself
              send_from(self, j->second.joiner, drain_atom::value, on, ticket);
          say(n, fmt::format("node '{}' {}", printable(name),
                             on ? "is drained: no new ranks, elastic jobs leave it"
                                : "is back in placement (undrained)"));
          nudge_watchers(self);
          return {};
        },
        [self, refresh_self](cancel_atom, std::string& job,
                             signed_ticket& ticket) -> std::tuple<std::string, std::vector<std::string>> {
          auto& st = self->state;
          auto& n = settings_of(self->system());
          if (!st.join_target.empty())
            return {fmt::format("the agent '{}' holds no table: it joined the cluster at {}",
                                n.name, st.join_target),
                    {}};
          refresh_self();
          auto view = st.table.view(unix_ms());
          canceller who;
          try {
            who = check_cancel(n, ticket, to_string(self->system().node()), job);
          } catch (const std::exception& e) {
            return {fmt::format("the agent refused to cancel job {}: {}", printable(job),
                                e.what()),
                    {}};
          }
          // The nodes that run it (its owner's job of that id, for a driver's cancel), as
          // their reports say; each checks the ticket again
          std::vector<std::string> where;
          std::set<std::string> others; // owners of a job of that id the canceller may not end
          for (auto& row : view.nodes)
            for (auto& j : row.info.jobs)
              if (j.job == job && row.state == "alive") {
                if (who.only.empty() || j.owner == who.only)
                  where.push_back(row.info.name);
                else
                  others.insert(j.owner);
              }
          st.table.release(job, who.only); // slots held for it, if any (its owner's)
          if (where.empty() && !others.empty())
            return {fmt::format("the agent refused to cancel job {}: job {} is {}'s, not '{}''s",
                                printable(job), printable(job),
                                printable(fmt::format("'{}'", fmt::join(others, "', '"))),
                                printable(who.only)),
                    {}};
          if (where.empty())
            return {fmt::format("no node runs job {} ('caf-hvd jobs' lists the jobs that run)",
                                printable(job)),
                    {}};
          auto by = who.by;
          for (auto& name : where) {
            if (name == n.name) {
              post_from(n.guardian, cancel_atom::value, job, who.only, by);
            } else if (auto m = st.table.member_of(name)) {
              if (auto j = st.members.find(*m); j != st.members.end())
                // the node checks the ticket itself
                send_from(self, j->second.joiner, cancel_atom::value, job, ticket);
            }
          }
          say(n, fmt::format("job {} cancelled by {}: its ranks stop on {}", printable(job), by,
                             fmt::join(where, ", ")));
          return {std::string{}, where};
        },
        [self, refresh_self](deadline_atom, uint64_t token) {
          if (token != self->state.timer)
            return; // not its own timer
          refresh_self();
          self->state.table.expire(unix_ms(), keep_gone_ms);
          nudge_watchers(self); // the holder's own row, holds that ran out
          keep_members(self);
          keep_placements(self);
          self->delayed_send(self, report_tick, deadline_atom::value, token);
        },
    };
  });
}

} // namespace cafhvd
