// Helpers shared by the static and the elastic driver.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <caf/all.hpp>

#include "actors/protocol.hpp"
#include "actors/senders.hpp"
#include "runtime/launch/process.hpp"

namespace cafhvd {

/// Names a job in node agents' messages: driver host, pid and a time stamp.
std::string make_job_id();

/// Queues all of `s` for `fd` on the process's output thread (runtime/observe/output_writer):
/// a stalled reader never blocks an actor. Output to a closed pipe is dropped.
void write_all(int fd, std::string s);

/// Writes each line followed by '\n', each prefixed with `prefix`, in one write_all.
void write_lines(int fd, const std::vector<std::string>& lines, std::string_view prefix = {});

/// Runs `done` on the output thread once everything queued before is written.
void after_output(std::function<void()> done);

/// Closes `fd` once everything queued for it is written.
void close_output(int fd);

/// Blocks until everything queued is written (a driver process's last step).
void flush_output();

/// Answers output requests only once their lines are written, so ranks that print
/// faster than the driver's stdout drains are slowed down, without blocking the actor.
class output_acks {
public:
  template <class Self> caf::result<caf::ok_atom> after_write(Self* self) {
    auto id = next_++;
    auto rp = self->template make_response_promise<caf::ok_atom>();
    pending_.emplace(id, rp);
    auto hdl = caf::actor_cast<caf::actor>(self);
    after_output([hdl, id] { post_from(hdl, output_atom::value, id); });
    return rp;
  }
  void written(uint64_t id) {
    auto it = pending_.find(id);
    if (it == pending_.end())
      return;
    it->second.deliver(caf::ok_atom::value);
    pending_.erase(it);
  }

private:
  uint64_t next_ = 0;
  std::map<uint64_t, caf::typed_response_promise<caf::ok_atom>> pending_;
};

/// How a rank ended, for messages: "exit code 3", "signal 15 (Terminated), stopped by
/// its node agent (node agent 'h1' received Terminated)".
std::string describe_exit(const exit_status& st, const std::string& stopped_by);

/// The driver's tag of a rank's output line: "[RANK]<stdout>:" ("[?]" for rank < 0).
std::string output_tag(int rank, int stream);

/// Why connecting to a node agent failed, in words a user can act on.
/// `peer` ("ip:port") finds the reason the TLS layer recorded for a refused handshake.
std::string connect_error(caf::actor_system& sys, const caf::error& e, bool tls,
                          const std::string& peer = {});

/// What the driver prints when the job's torch store closed a client for a protocol
/// violation (`problem` names where, the client, its dialect and what it sent).
std::string torch_store_problem_message(const std::string& problem);

/// Whether a rank's output line is torch's refusal to build a store client without
/// libuv ("use_libuv was requested but PyTorch was build without libuv support").
bool says_torch_lacks_libuv(const std::string& line);

/// What the driver prints, once, when rank `rank` said so while the job's store served.
std::string torch_without_libuv_message(int rank);

/// The name of a node's loopback interface ("lo" if it reported none).
std::string loopback_name(const node_info& info);

} // namespace cafhvd
