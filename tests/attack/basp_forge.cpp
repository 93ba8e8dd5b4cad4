// A forging peer: speaks TLS with OpenSSL itself and writes BASP frames by hand (payloads
// with CAF's serializer and caf-hvd's message types), so it sends what CAF never would.
// With any credential directory of the cluster it connects to a node agent and tries each
// way a certificate could reach past its connection (issue 48's paths), one connection
// per attempt, and prints for each whether the agent closed the connection ("closed") or
// kept it ("open"). The direct messages to actor ids 1..N (workers, launch, launch_spec,
// call, terminate) are well-formed and stay on an open connection: the actors must refuse
// them, which the cluster suite checks on the file the command would create and on the
// job that must finish.
//
// usage: caf-hvd-basp-forge CREDS_DIR ROLE HOST PORT MARKER MAX_ACTOR_ID [MODE [SEED]]
//   ROLE: driver, node or admin (which certificate of CREDS_DIR to present)
//   MODE: records (default: each attempt's frames, several, in one TLS record) or bytes
//         (one byte per TLS record)
//   SEED: the node id this peer claims (the same seed claims the same id; default random)
//
// usage: caf-hvd-basp-forge CREDS_DIR ROLE --serve-version APP_ID PORT_FILE
//   An agent of another caf-hvd version: listens on 127.0.0.1 (its port written to
//   PORT_FILE), answers each connection with a server handshake that names APP_ID as its
//   application id, and reads until the peer closes it; for 60 s.
#include <arpa/inet.h>
#include <chrono>
#include <map>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <netdb.h>
#include <poll.h>
#include <random>
#include <set>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <caf/io/basp/header.hpp>
#include <caf/io/basp/version.hpp>

#include "actors/config.hpp"
#include "actors/protocol.hpp"

using namespace cafhvd;
namespace basp = caf::io::basp;

namespace {

std::string mode = "records";

struct tls_peer {
  int fd = -1;
  SSL* ssl = nullptr;
  ~tls_peer() {
    if (ssl)
      SSL_free(ssl);
    if (fd >= 0)
      ::close(fd);
  }
};

// A TLS context with `role`'s certificate of `dir` that verifies its peer against the
// cluster's CA: a client's, or (server) an agent's that requires the peer's certificate.
SSL_CTX* make_context(const std::string& dir, const std::string& role, bool server = false) {
  auto* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (SSL_CTX_use_certificate_chain_file(ctx, (dir + "/" + role + ".pem").c_str()) != 1
      || SSL_CTX_use_PrivateKey_file(ctx, (dir + "/" + role + ".key").c_str(), SSL_FILETYPE_PEM)
             != 1
      || SSL_CTX_load_verify_locations(ctx, (dir + "/ca.pem").c_str(), nullptr) != 1) {
    std::fprintf(stderr, "cannot load %s's %s credentials\n", dir.c_str(), role.c_str());
    std::exit(2);
  }
  SSL_CTX_set_verify(ctx, server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                                 : SSL_VERIFY_PEER,
                     nullptr);
  return ctx;
}

bool connect_tls(tls_peer& p, SSL_CTX* ctx, const std::string& host, uint16_t port) {
  p.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
  if (::connect(p.fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0)
    return false;
  timeval tv{5, 0};
  setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  p.ssl = SSL_new(ctx);
  SSL_set_fd(p.ssl, p.fd);
  return SSL_connect(p.ssl) == 1;
}

bool write_all(tls_peer& p, const std::string& bytes) {
  if (mode == "bytes") {
    for (char c : bytes)
      if (SSL_write(p.ssl, &c, 1) != 1)
        return false;
    return true;
  }
  return bytes.empty() || SSL_write(p.ssl, bytes.data(), static_cast<int>(bytes.size())) > 0;
}

// Reads one whole frame (header and payload), or returns false when the connection ends.
bool read_frame(tls_peer& p, basp::header& hdr, std::string& payload, caf::actor_system& sys) {
  auto read_n = [&](size_t n, std::string& out) {
    out.resize(n);
    size_t have = 0;
    while (have < n) {
      int r = SSL_read(p.ssl, out.data() + have, static_cast<int>(n - have));
      if (r <= 0)
        return false;
      have += static_cast<size_t>(r);
    }
    return true;
  };
  std::string h;
  if (!read_n(basp::header_size, h))
    return false;
  caf::binary_deserializer src{sys, h.data(), h.size()};
  if (src(hdr))
    return false;
  return read_n(hdr.payload_len, payload);
}

// Whether the agent ends the connection within 3 s (heartbeats and answers are read past).
bool closed_soon(tls_peer& p) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd pfd{p.fd, POLLIN, 0};
    if (SSL_pending(p.ssl) == 0 && ::poll(&pfd, 1, 100) <= 0)
      continue;
    int r = SSL_read(p.ssl, buf, sizeof(buf));
    if (r <= 0) {
      int e = SSL_get_error(p.ssl, r);
      if (e == SSL_ERROR_WANT_READ)
        continue;
      return true;
    }
  }
  return false;
}

struct forger {
  caf::actor_system& sys;
  SSL_CTX* ctx;
  std::string host;
  uint16_t port;
  std::string agent_node; // the agent's node id (serialized), from its handshake
  std::string my_node;
  uint64_t next_request = 1;

  template <class... Ts> std::string bytes(Ts&&... xs) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    if (sink(xs...))
      std::abort();
    return {buf.begin(), buf.end()};
  }
  std::string frame(basp::message_type op, uint8_t flags, uint64_t op_data, uint64_t src,
                    uint64_t dst, const std::string& payload) {
    basp::header hdr{op, flags, static_cast<uint32_t>(payload.size()), op_data, src, dst};
    return bytes(hdr) + payload;
  }
  std::string node_bytes(uint32_t pid, uint8_t fill) {
    // never all zeros: CAF writes a node id with an empty host hash as "no node"
    std::string hash(40, "123456789abcdef"[fill % 15]);
    return bytes(caf::make_node_id(pid, hash).value());
  }
  std::string handshake(const std::string& node) {
    return frame(basp::message_type::client_handshake, 0, 0, 0, 0, node);
  }
  std::string direct(uint64_t dst, const caf::message& msg, uint8_t flags = 0) {
    std::vector<caf::strong_actor_ptr> stages;
    auto mid = caf::make_message_id(caf::message_priority::normal).integer_value()
               | next_request++;
    return frame(basp::message_type::direct_message, flags, mid, 1, dst, bytes(stages, msg));
  }

  // A fresh connection: the agent's handshake read, nothing of ours written yet.
  bool open(tls_peer& p) {
    if (!connect_tls(p, ctx, host, port))
      return false;
    basp::header hdr;
    std::string payload;
    if (!read_frame(p, hdr, payload, sys) || hdr.operation != basp::message_type::server_handshake)
      return false;
    agent_node = payload.substr(0, 32);
    return true;
  }

  // Sends `frames` on a fresh connection and says whether the agent closed it.
  void attempt(const char* name, const std::string& frames) {
    tls_peer p;
    if (!open(p)) {
      std::printf("%s: cannot connect\n", name);
      return;
    }
    write_all(p, frames);
    std::printf("%s: %s\n", name, closed_soon(p) ? "closed" : "open");
    std::fflush(stdout);
  }
};

// An agent of another version (see the usage above).
int serve_version(const std::string& dir, const std::string& role, const std::string& app_id,
                  const std::string& port_file) {
  hvd_config cfg;
  caf::actor_system sys{cfg};
  auto* ctx = make_context(dir, role, true);
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t len = sizeof(sa);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(lfd, 8) != 0
      || ::getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    std::perror("listen");
    return 2;
  }
  if (auto* f = std::fopen(port_file.c_str(), "w")) {
    std::fprintf(f, "%u\n", ntohs(sa.sin_port));
    std::fclose(f);
  }
  forger f{sys, ctx, "127.0.0.1", 0, {}, {}};
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    pollfd pfd{lfd, POLLIN, 0};
    if (::poll(&pfd, 1, 200) <= 0)
      continue;
    tls_peer p;
    p.fd = ::accept(lfd, nullptr, nullptr);
    if (p.fd < 0)
      continue;
    timeval tv{5, 0};
    setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    p.ssl = SSL_new(ctx);
    SSL_set_fd(p.ssl, p.fd);
    if (SSL_accept(p.ssl) != 1)
      continue;
    // CAF 0.17.6's server handshake: this node, its application ids, the published
    // actor (none) and its interface
    auto payload = f.node_bytes(4321, 3) + f.bytes(std::vector<std::string>{app_id})
                   + f.bytes(uint64_t{0}, std::set<std::string>{});
    write_all(p, f.frame(basp::message_type::server_handshake, 0, basp::version, 0, 0, payload));
    std::printf("answered a connection as %s: %s\n", app_id.c_str(),
                closed_soon(p) ? "the peer closed it" : "the peer kept it");
    std::fflush(stdout);
  }
  SSL_CTX_free(ctx);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[3]) == "--serve-version") {
    std::signal(SIGPIPE, SIG_IGN);
    return serve_version(argv[1], argv[2], argv[4], argv[5]);
  }
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s CREDS_DIR ROLE HOST PORT MARKER MAX_ACTOR_ID [MODE]\n",
                 argv[0]);
    return 2;
  }
  std::string dir = argv[1], role = argv[2], host = argv[3], marker = argv[5];
  unsigned seed = argc > 8 ? static_cast<unsigned>(std::stoul(argv[8])) : std::random_device{}();
  auto port = static_cast<uint16_t>(std::stoi(argv[4]));
  auto max_id = static_cast<uint64_t>(std::stoul(argv[6]));
  if (argc > 7)
    mode = argv[7];
  std::signal(SIGPIPE, SIG_IGN); // a closed connection is a result, not the end
  hvd_config cfg;
  caf::actor_system sys{cfg};
  auto* ctx = make_context(dir, role);
  forger f{sys, ctx, host, port, {}, {}};
  f.my_node = f.node_bytes(seed % 100000 + 2, static_cast<uint8_t>(seed / 7));
  {
    tls_peer p;
    if (!f.open(p)) {
      std::printf("connect: failed\n");
      return 1;
    }
    std::printf("connect: ok\n");
  }
  auto hs = f.handshake(f.my_node);
  auto other = f.node_bytes(4242, 0x0e);
  auto workers = caf::make_message(workers_atom::value, std::vector<uint32_t>{0}, uint32_t{0});
  auto hb = f.frame(basp::message_type::heartbeat, 0, 0, 0, 0, {});
  std::vector<caf::strong_actor_ptr> no_stages;
  // the guard's rules, one connection each
  f.attempt("frame before the handshake", f.direct(5, workers));
  f.attempt("handshake claiming the agent's own node id", f.handshake(f.agent_node));
  f.attempt("routed message to another node",
            hs + f.frame(basp::message_type::routed_message, 0, 1, 1, 5,
                         f.bytes(caf::make_node_id(1, std::string(40, 'c')).value(),
                                 caf::make_node_id(7, std::string(40, 'd')).value(), no_stages,
                                 workers)));
  // a routed message whose source is the agent itself: CAF would take it from a local actor
  {
    std::string routed_payload = f.agent_node + f.agent_node + f.bytes(no_stages, workers);
    f.attempt("routed message posing as the agent's own actor",
              hs + f.frame(basp::message_type::routed_message, 0, 1, 1, 5, routed_payload));
  }
  caf::error gone = caf::exit_reason::remote_link_unreachable;
  f.attempt("down message for another node",
            hs + f.frame(basp::message_type::down_message, 0, 0, 3, 0, other + f.agent_node
                                                                           + f.bytes(gone)));
  f.attempt("monitor message for another node",
            hs + f.frame(basp::message_type::monitor_message, 0, 0, 0, 3, other + f.agent_node));
  f.attempt("ConfigServ lookup",
            hs + f.direct(static_cast<uint64_t>(caf::atom("ConfigServ")),
                          caf::make_message(caf::get_atom::value, std::string{"middleman.app-identifiers"}),
                          basp::header::named_receiver_flag));
  f.attempt("ConfigServ put",
            hs + f.direct(static_cast<uint64_t>(caf::atom("ConfigServ")),
                          caf::make_message(caf::put_atom::value, std::string{"x"}, caf::message{}),
                          basp::header::named_receiver_flag));
  {
    basp::header big{basp::message_type::direct_message, 0, 0x7ff00000u, 1, 1, 5};
    f.attempt("oversized frame", hs + f.bytes(big) + std::string(1024, 'x'));
  }
  {
    // a link of actor 5 to a proxy of this peer's: CAF would kill actor 5 with the proxy
    std::string link_payload = f.bytes(no_stages) + std::string("\0\0", 2);
    std::string tname = "@<>+@atom+@strong_actor_ptr";
    link_payload += static_cast<char>(tname.size()) + tname;
    link_payload += f.bytes(caf::link_atom::uint_value()) + f.bytes(uint64_t{77}) + f.my_node;
    f.attempt("link message", hs + f.frame(basp::message_type::direct_message, 0, 1, 1, 5,
                                           link_payload));
  }
  // the same node id from two certificates: the second is refused (a node id is bound to
  // the certificate that first claimed it, for the agent's life)
  {
    tls_peer p;
    if (f.open(p)) {
      write_all(p, hs + hb);
      std::printf("claim of node id %u: %s\n", seed, closed_soon(p) ? "closed" : "open");
    }
  }
  // the direct messages that reached alice's actors before: well-formed, to every id
  {
    tls_peer p;
    if (!f.open(p)) {
      std::printf("sweep: cannot connect\n");
      return 1;
    }
    write_all(p, hs);
    launch_batch b;
    b.argv = {"/bin/sh", "-c", "id -un > " + marker};
    b.slots = {0};
    b.envs = {{}};
    launch_spec spec;
    spec.argv = b.argv;
    // every message is a request: a handled one gets an answer (a refusal, a result, or
    // CAF's error for an unexpected message), one to an id without an actor CAF's bounce
    std::map<uint64_t, uint64_t> target; // request id -> actor id
    std::string out;
    auto ask = [&](uint64_t id, const caf::message& msg) {
      target[f.next_request] = id;
      out += f.direct(id, msg);
    };
    for (uint64_t id = 1; id <= max_id; ++id) {
      ask(id, workers);
      ask(id, caf::make_message(launch_atom::value, b));
      ask(id, caf::make_message(launch_atom::value, spec));
      ask(id, caf::make_message(call_atom::value, uint64_t{1}, uint32_t{0},
                                std::string{"payload"}, std::vector<uint32_t>{0}));
      ask(id, caf::make_message(call_atom::value, uint64_t{1}, uint32_t{0},
                                std::string{"payload"}));
      ask(id, caf::make_message(result_atom::value, uint64_t{1}, std::string{"forged"}));
      ask(id, caf::make_message(log_atom::value, std::string{"forged"}));
      ask(id, caf::make_message(output_atom::value, output_batch{0, 0, {"forged output"}}));
      ask(id, caf::make_message(terminate_atom::value, int32_t{9}));
    }
    // then one more request to every id. An actor handles one peer's messages in the order
    // they came, so an actor that answers its last one has handled the whole sweep, and
    // whatever the sweep made it start has started. An id that answers nothing at all is
    // an actor that keeps every message unhandled (CAF's per-peer spawn-server helper
    // skips all until its peer's ConfigServ answers, which this peer never does).
    std::map<uint64_t, uint64_t> last; // actor id -> request id of its last request
    for (uint64_t id = 1; id <= max_id; ++id) {
      last[id] = f.next_request;
      ask(id, workers);
    }
    bool ok = write_all(p, out);
    std::set<uint64_t> answered_any, answered_last;
    std::set<uint64_t> last_ids;
    for (auto& [id, req] : last)
      last_ids.insert(req);
    timeval tv{5, 0}; // a frame once begun comes whole, or the read fails
    setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    // the answers come within a second; the deadline only bounds the wait for the silent
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    basp::header hdr;
    std::string payload;
    while (ok && answered_last.size() < max_id && std::chrono::steady_clock::now() < until) {
      pollfd pfd{p.fd, POLLIN, 0};
      if (SSL_pending(p.ssl) == 0 && ::poll(&pfd, 1, 100) <= 0)
        continue;
      if (!read_frame(p, hdr, payload, sys)) {
        ok = false;
        break;
      }
      caf::message_id mid{hdr.operation_data};
      if (hdr.operation != basp::message_type::direct_message || !mid.is_response())
        continue;
      auto req = mid.request_id().integer_value();
      auto i = target.find(req);
      if (i == target.end())
        continue;
      answered_any.insert(i->second);
      if (last_ids.count(req) > 0)
        answered_last.insert(i->second);
    }
    std::string late;
    for (auto id : answered_any)
      if (answered_last.count(id) == 0)
        late += " " + std::to_string(id);
    std::printf("sweep's last requests: %zu of %llu answered, %llu ids answered nothing\n",
                answered_last.size(), static_cast<unsigned long long>(max_id),
                static_cast<unsigned long long>(max_id - answered_any.size()));
    std::printf("ids that answered but not their last request:%s\n",
                late.empty() ? " none" : late.c_str());
    std::printf("direct sweep of ids 1..%llu: %s\n", static_cast<unsigned long long>(max_id),
                ok && !closed_soon(p) ? "sent, connection open" : "closed");
  }
  std::fflush(stdout);
  SSL_CTX_free(ctx);
  return 0;
}
