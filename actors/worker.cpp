// The worker: one rank's process, its output, exit and executor channel.
#include "actors/node_actors.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <set>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include "actors/config.hpp"
#include "actors/senders.hpp"
#include "runtime/network/net.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/observe/text.hpp"
#include "runtime/network/socket_abort.hpp"

namespace cafhvd {

namespace {

using worker_ptr = worker_actor::stateful_pointer<worker_state>;

// deadline_atom's id for "the channel reached EOF with calls outstanding"
constexpr uint64_t eof_check = ~uint64_t{0};
// ... and for "the process exited, its channel has not reached EOF yet"
constexpr uint64_t exit_check = ~uint64_t{0} - 1;
// ... and for "sample the rank's CPU time" (each second while it runs)
constexpr uint64_t life_tick = ~uint64_t{0} - 2;
constexpr std::chrono::seconds life_period{1};

// A rank is alive while its process tree uses CPU time: one in a long step is, one
// blocked for ever (a deadlock, a read that never returns, SIGSTOP) is not.
void sample_life(worker_ptr self) {
  auto& st = self->state;
  if (!st.child)
    return;
  auto ticks = tree_cpu_ticks(st.child->pid());
  if (ticks != st.cpu_ticks) {
    st.cpu_ticks = ticks;
    st.alive_at = std::chrono::steady_clock::now();
  }
}

// The reader thread turns frames into messages: answers straight to the job when
// nothing of the rank is on its way through the worker (call_book), the rest to the
// worker. A rank may only answer and log, and its log records wait for credit (a rank
// that logs without pause blocks on its socket, nothing is dropped).
void open_channel(worker_ptr self, int fd, uint64_t max_frame) {
  auto hdl = caf::actor_cast<worker_actor>(self);
  auto window = self->state.log_window;
  auto book = self->state.book;
  auto driver = self->state.driver;
  auto slot = self->state.rank;
  self->state.channel = std::make_unique<frame_channel>(
      fd, max_frame > 0 ? max_frame : default_max_frame,
      [hdl, window, book, driver, slot](frame&& f) {
        switch (f.kind) {
        case frame_kind::result: {
          std::unique_lock g{book->m};
          if (book->closed)
            return;
          if (book->calls.empty() || book->calls.front() != f.id) {
            book->closed = true;
            auto problem =
                book->calls.empty()
                    ? fmt::format("answered call {} with no call outstanding", f.id)
                    : fmt::format("answered call {} while call {} was the oldest outstanding", f.id,
                                  book->calls.front());
            g.unlock();
            post_from(hdl, chanend_atom::value, problem);
            return;
          }
          book->calls.pop_front();
          if (book->via_worker == 0) {
            g.unlock();
            caf::send_as(hdl, driver, result_atom::value, slot, f.id, std::move(f.payload));
          } else {
            ++book->via_worker;
            g.unlock();
            post_from(hdl, result_atom::value, f.id, std::move(f.payload));
          }
          return;
        }
        case frame_kind::log:
          if (window->acquire()) {
            {
              std::lock_guard g{book->m};
              ++book->via_worker;
            }
            post_from(hdl, log_atom::value, std::move(f.payload));
          }
          return;
        default: {
          std::unique_lock g{book->m};
          book->closed = true; // nothing after it goes on
          g.unlock();
          post_from(hdl, chanend_atom::value,
                         fmt::format("sent a {} frame (a rank may send only result and log)",
                                     frame_kind_name(static_cast<uint8_t>(f.kind))));
        }
        }
      },
      [hdl](const std::string& problem) { post_from(hdl, chanend_atom::value, problem); });
}

// A frame the reader handed to the worker has gone on to the job.
void sent_on(worker_ptr self) {
  std::lock_guard g{self->state.book->m};
  --self->state.book->via_worker;
}

void start_call(worker_ptr self, uint64_t id, uint32_t deadline_ms, std::string payload) {
  auto& st = self->state;
  {
    std::lock_guard g{st.book->m};
    st.book->calls.push_back(id);
  }
  frame f;
  f.kind = frame_kind::call;
  f.id = id;
  f.deadline_ms = deadline_ms;
  f.payload = std::move(payload);
  st.channel->send(std::move(f));
  if (deadline_ms > 0)
    self->delayed_send(self, std::chrono::milliseconds(deadline_ms), deadline_atom::value, id);
}

// The rank broke its channel's rules: its state is unknown, so it ends now; the job
// hears why before the exit report.
void channel_broke(worker_ptr self, const std::string& what) {
  auto& st = self->state;
  st.channel_broken = true;
  {
    std::lock_guard g{st.book->m};
    st.book->closed = true;
  }
  self->send(st.driver, chanfail_atom::value, st.rank, what);
  if (st.child)
    st.child->signal_group(SIGKILL);
}

// A signal for the rank's process group; one that comes before the process exists (the
// job stopping ranks whose launch is still on its way) is kept and sent after the launch,
// or the rank would run until the teardown's SIGKILL. SIGKILL outranks a kept SIGTERM.
void signal_rank(worker_ptr self, int32_t sig) {
  auto& st = self->state;
  if (st.child)
    st.child->signal_group(sig);
  else if (st.early_signal != SIGKILL)
    st.early_signal = sig;
}

} // namespace

worker_actor::behavior_type worker_fn(worker_actor::stateful_pointer<worker_state> self,
                                      colocator_actor colocator, driver_actor driver,
                                      coordinator_actor coordinator, uint32_t rank,
                                      std::shared_ptr<const rank_identity> account) {
  self->state.driver = driver;
  self->state.rank = rank;
  self->set_default_handler(drop_unexpected);
  self->state.account = std::move(account);
  // Registration: the coordinator checks that the slot runs where it was placed.
  if (coordinator)
    self->send(coordinator, report_atom::value, rank, settings_of(self->system()).name);
  // A colocator that dies abnormally (node shutdown) takes its workers along.
  self->link_to(colocator);
  self->send(colocator, enlist_atom::value, caf::actor_cast<worker_actor>(self));
  // A worker obeys its colocator and its job's driver, and takes its process's output,
  // exit and frames only from its own threads (actors/senders.hpp).
  auto from = [=](const char* what, bool colocator_may, bool driver_may) {
    return admitted(self,
                    (colocator_may && sent_by(self, colocator))
                        || (driver_may && sent_by(self, driver)),
                    "a worker", what);
  };
  auto from_itself = [=](const char* what) {
    return admitted(self, sent_by_itself(self), "a worker", what);
  };
  auto report_exit = [=](const exit_status& st) {
    rank_exit ex{self->state.rank, settings_of(self->system()).name,
                 st.code,          st.signal,
                 st.exec_error,    self->state.stopped_by};
    self->send(self->state.driver, exited_atom::value, ex);
    self->quit();
  };
  return {
      [=](launch_atom, launch_spec& spec) -> caf::result<int32_t> {
        if (!from("a launch", true, false))
          return refused_error("launch");
        auto& st = self->state;
        process_spec ps{settings_of(self->system()).shim, std::move(spec.argv), std::move(spec.env),
                        std::move(spec.cwd)};
        if (auto& a = st.account) {
          // the account's own HOME, USER and LOGNAME, whatever the driver forwarded
          std::erase_if(ps.env, [](const std::string& kv) {
            return kv.rfind("HOME=", 0) == 0 || kv.rfind("USER=", 0) == 0
                   || kv.rfind("LOGNAME=", 0) == 0;
          });
          ps.env.push_back("HOME=" + a->home);
          ps.env.push_back("USER=" + a->user);
          ps.env.push_back("LOGNAME=" + a->user);
          ps.as = identity_arg(*a);
        }
        auto hdl = caf::actor_cast<worker_actor>(self);
        auto window = st.window;
        auto r = st.rank;
        int sv[2] = {-1, -1};
        if (spec.executor) {
          if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            report_exit(exit_status{
                127, 0, fmt::format("cannot make the executor channel: {}", std::strerror(errno))});
            return 0;
          }
          ps.channel_fd = sv[1];
          ps.env.push_back(fmt::format("CAF_HVD_CHANNEL_FD={}", rank_channel_fd));
          ps.env.push_back(fmt::format("CAF_HVD_MAX_FRAME={}",
                                       spec.max_frame > 0 ? spec.max_frame : default_max_frame));
        }
        try {
          st.child = std::make_unique<child_process>(
              ps,
              [hdl, window, r](stream_kind k, std::vector<std::string>&& lines) {
                if (window->acquire())
                  post_from(hdl, output_atom::value,
                                 output_batch{r, static_cast<int32_t>(k), std::move(lines)});
              },
              [hdl, r](const exit_status& es) {
                post_from(hdl, exited_atom::value,
                               rank_exit{r, {}, es.code, es.signal, es.exec_error, {}});
              });
        } catch (const std::exception& e) {
          for (int fd : sv)
            if (fd >= 0)
              ::close(fd);
          report_exit(exit_status{127, 0, e.what()});
          return 0;
        }
        if (st.early_signal) // stopped while its launch was on its way
          st.child->signal_group(st.early_signal);
        st.alive_at = std::chrono::steady_clock::now();
        st.cpu_ticks = tree_cpu_ticks(st.child->pid());
        self->delayed_send(self, life_period, deadline_atom::value, life_tick);
        if (spec.executor) {
          ::close(sv[1]);
          open_channel(self, sv[0], spec.max_frame);
          if (!spec.boot.empty())
            start_call(self, 0, 0, std::move(spec.boot));
        }
        return st.child->pid();
      },
      [=](call_atom, uint64_t id, uint32_t deadline_ms, std::string& payload) {
        if (!from("an executor call", true, false))
          return;
        auto& st = self->state;
        if (!st.channel || st.channel_broken)
          return; // the job learns why from chanfail or the exit report
        start_call(self, id, deadline_ms, std::move(payload));
        if (st.channel_eof) // nobody reads it: the EOF check decides
          self->delayed_send(self, std::chrono::seconds(2), deadline_atom::value, eof_check);
      },
      [=](close_atom) {
        if (!from("a channel close", true, true))
          return;
        if (self->state.channel)
          self->state.channel->close_after_writes();
      },
      [=](result_atom, uint64_t id, std::string& payload) {
        if (!from_itself("a result"))
          return;
        // an answer the reader checked, behind the rank's earlier frames
        auto& st = self->state;
        if (!st.channel_broken)
          self->send(st.driver, result_atom::value, st.rank, id, std::move(payload));
        sent_on(self);
      },
      [=](log_atom, std::string& payload) {
        if (!from_itself("a log record"))
          return;
        auto window = self->state.log_window;
        self->request(self->state.driver, std::chrono::seconds(60), log_atom::value,
                      self->state.rank, std::move(payload))
            .then([window](caf::ok_atom) { window->release(); },
                  [window](caf::error&) { window->release(); });
        sent_on(self);
      },
      [=](chanend_atom, const std::string& problem) {
        if (!from_itself("a channel end"))
          return;
        auto& st = self->state;
        if (st.channel_broken)
          return;
        if (!problem.empty()) {
          channel_broke(self, problem);
          if (st.held_exit)
            report_exit(*std::exchange(st.held_exit, std::nullopt));
          return;
        }
        // A process that dies closes its channel first: give its exit report a moment
        // to name the death before calling the EOF itself the cause.
        st.channel_eof = true;
        // It exited first: everything it wrote has gone on now (the reader hands each
        // frame on before it reports the EOF), so its exit follows its last result.
        if (st.held_exit)
          return report_exit(*std::exchange(st.held_exit, std::nullopt));
        if (st.book->size() > 0)
          self->delayed_send(self, std::chrono::seconds(2), deadline_atom::value, eof_check);
      },
      [=](deadline_atom, uint64_t id) {
        if (!from_itself("a deadline"))
          return;
        auto& st = self->state;
        if (id == life_tick) {
          sample_life(self);
          self->delayed_send(self, life_period, deadline_atom::value, life_tick);
          return;
        }
        if (id == exit_check) { // a descendant keeps its channel open: the exit goes on
          if (st.held_exit)
            report_exit(*std::exchange(st.held_exit, std::nullopt));
          return;
        }
        if (st.channel_broken)
          return;
        if (id == eof_check) {
          if (auto n = st.book->size(); n > 0)
            channel_broke(self, fmt::format("closed its channel with {} call{} unanswered", n,
                                            n == 1 ? "" : "s"));
          return;
        }
        if (st.book->outstanding(id))
          channel_broke(self, fmt::format("did not answer call {} within its deadline", id));
      },
      [=](terminate_atom, int32_t sig) {
        if (from("a signal", true, true))
          signal_rank(self, sig);
      },
      [=](stop_atom, const std::string& why) {
        if (!from("a stop", true, false))
          return;
        self->state.stopped_by = why;
        signal_rank(self, SIGTERM);
      },
      [=](alive_atom) -> caf::result<uint32_t> {
        if (!from("a question whether the rank is alive", false, true))
          return refused_error("alive");
        sample_life(self);
        auto& st = self->state;
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - st.alive_at)
                      .count();
        return static_cast<uint32_t>(std::clamp<int64_t>(ms, 0, UINT32_MAX));
      },
      [=](output_atom, output_batch& batch) {
        if (!from_itself("output"))
          return;
        self->state.alive_at = std::chrono::steady_clock::now();
        auto window = self->state.window;
        self->request(self->state.driver, std::chrono::seconds(60), output_atom::value,
                      std::move(batch))
            .then([window](caf::ok_atom) { window->release(); },
                  [window](caf::error&) { window->release(); });
      },
      [=](exited_atom, rank_exit& ex) {
        if (!from_itself("an exit report"))
          return;
        auto& st = self->state;
        exit_status es{ex.code, ex.signal, ex.exec_error};
        // The exit is seen on another thread than the channel's frames: a frame the
        // process wrote just before it ended (an elastic rank's result) may not be read
        // yet. The exit waits for the channel's EOF (at most 2 s), or the job would fail
        // the call and drop the result that follows.
        if (st.channel && !st.channel_eof && !st.channel_broken) {
          st.held_exit = es;
          self->delayed_send(self, std::chrono::seconds(2), deadline_atom::value, exit_check);
          return;
        }
        report_exit(es);
      },
  };
}

worker_actor spawn_worker(caf::actor_system& sys, colocator_actor colocator, driver_actor driver,
                          coordinator_actor coordinator, uint32_t slot,
                          std::shared_ptr<const rank_identity> account) {
  return sys.spawn(worker_fn, std::move(colocator), std::move(driver), std::move(coordinator),
                   slot, std::move(account));
}

} // namespace cafhvd
