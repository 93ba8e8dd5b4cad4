#include "actors/driver_util.hpp"

#include "runtime/network/net.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/observe/text.hpp"

#include <cerrno>
#include <chrono>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "runtime/observe/output_writer.hpp"

namespace cafhvd {

std::string make_job_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return fmt::format("{}-{}-{}", host, getpid(),
                     std::chrono::system_clock::now().time_since_epoch().count() % 1000000);
}

namespace {
// Never destroyed: output queued by any actor is written until the process ends, and
// flush_output() waits for it.
output_writer& process_output() {
  static auto* w = new output_writer;
  return *w;
}
} // namespace

void write_all(int fd, std::string s) {
  process_output().write(fd, std::move(s));
}

void after_output(std::function<void()> done) {
  process_output().write(-1, {}, std::move(done));
}

void close_output(int fd) {
  process_output().close_after(fd);
}

void flush_output() {
  process_output().flush();
}

void write_lines(int fd, const std::vector<std::string>& lines, std::string_view prefix) {
  std::string text;
  size_t bytes = 0;
  for (auto& l : lines)
    bytes += prefix.size() + l.size() + 1;
  text.reserve(bytes);
  for (auto& l : lines) {
    text += prefix;
    text += l;
    text += '\n';
  }
  write_all(fd, std::move(text));
}

std::string describe_exit(const exit_status& st, const std::string& stopped_by) {
  if (stopped_by.empty())
    return st.describe();
  return fmt::format("{}, stopped by its node agent ({})", st.describe(), stopped_by);
}

std::string output_tag(int rank, int stream) {
  auto name = stream == 1 ? "stderr" : "stdout";
  return rank < 0 ? fmt::format("[?]<{}>:", name) : fmt::format("[{}]<{}>:", rank, name);
}

std::string version_refusal(caf::actor_system& sys, const std::string& peer) {
  auto ours = caf::get_or(sys.config(), "middleman.app-identifiers", std::vector<std::string>{});
  auto ours_text = ours.empty() ? std::string{"?"} : fmt::format("{}", fmt::join(ours, ", "));
  // the agent's as its handshake named them (the wire guard read them; by address)
  std::vector<std::string> theirs;
  if (auto colon = peer.rfind(':'); colon != std::string::npos) {
    auto host = peer.substr(0, colon);
    auto port = peer.substr(colon + 1);
    theirs = net::module().peer_versions(peer);
    if (theirs.empty())
      if (auto ip = resolve_ipv4(host))
        theirs = net::module().peer_versions(*ip + ":" + port);
  }
  if (theirs.empty())
    return fmt::format("this caf-hvd speaks {} and the peer another protocol (not a caf-hvd "
                       "node agent of this version); upgrade both ends to the same release",
                       ours_text);
  std::vector<std::string> printable_ids;
  for (auto& t : theirs)
    printable_ids.push_back(printable(t));
  return fmt::format("version {} (this caf-hvd) refuses version {} (the agent at {}): "
                     "upgrade both ends to the same release",
                     ours_text, fmt::join(printable_ids, ", "), peer);
}

std::string connect_error(caf::actor_system& sys, const caf::error& e, bool tls,
                          const std::string& peer) {
  if (tls)
    if (auto why = net::module().tls_failure_for(peer); !why.empty())
      return "the TLS handshake failed: " + why;
  if (e == caf::sec::request_timeout)
    return "no answer before the start timeout";
  if (e == caf::sec::cannot_connect_to_node)
    return "connection refused or host unreachable (is `caf-hvd node` running there?)";
  if (e == caf::sec::connection_timeout)
    return "the peer accepted the connection but never completed the handshake (not a "
           "caf-hvd node agent, or a hung one)";
  if (e == caf::sec::disconnect_during_handshake)
    return tls ? "the TLS handshake failed: the agent is not of this cluster (another "
                 "CA), or runs with --insecure"
               : "the agent closed the connection during the handshake: it requires "
                 "TLS (drop --insecure and use the cluster's credentials)";
  if (e == caf::sec::incompatible_application_ids)
    return version_refusal(sys, peer);
  return sys.render(e);
}

bool says_torch_lacks_libuv(const std::string& line) {
  return line.find("use_libuv was requested") != std::string::npos;
}

std::string torch_without_libuv_message(int rank) {
  // torch 2.4+ makes libuv its TCPStore default; its env:// client of an agent's store
  // (torchrun's or this one) always asks for it, and only the path where rank 0 starts
  // the store reads USE_LIBUV.
  return fmt::format(
      "caf-hvd: error: rank {}'s torch was built without libuv (as Debian's torch 2.6 is): "
      "under env:// such a torch (2.4 and later) cannot be a client of a launcher's store "
      "(torchrun's fails alike)\n"
      "caf-hvd: rerun with --torch-store off: rank 0's torch then starts the store itself, "
      "and caf-hvd sets USE_LIBUV=0 for it\n",
      rank);
}

std::string loopback_name(const node_info& info) {
  for (auto& a : info.interfaces)
    if (a.loopback)
      return a.name;
  return "lo";
}

std::string torch_store_problem_message(const std::string& problem) {
  if (problem.find("over the job's torch store budget") != std::string::npos)
    return fmt::format("caf-hvd: error: torch store {}\n"
                       "caf-hvd: that client's connection was closed; the store and the job's "
                       "other clients go on\n",
                       problem);
  return fmt::format("caf-hvd: error: torch store {}\n"
                     "caf-hvd: the program's torch speaks a store protocol that caf-hvd's torch "
                     "store does not support; rerun with --torch-store off (rank 0 then starts "
                     "torch's own store at MASTER_PORT)\n",
                     problem);
}

} // namespace cafhvd
