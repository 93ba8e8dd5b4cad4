// The wire guard's connections, bindings and counts (net/wire_guard.hpp).
#include "net/wire_guard.hpp"

#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "net/credentials.hpp"
#include "runtime/launch/channel.hpp"
#include "runtime/network/basp_guard.hpp"
#include "runtime/observe/line_budget.hpp"

namespace cafhvd::wire {

namespace {

// The largest legitimate message is an executor payload of the default frame limit with
// its call's other fields; a driver with a larger --executor-max-frame-mb raises it.
constexpr uint64_t default_cap = default_max_frame + (uint64_t{1} << 20);

struct connection {
  std::unique_ptr<basp_guard> guard;
  std::string who;  // the certificate: "CN (role)"
  std::string cert; // "CN (sha256:...)"
  bool logged = false;
  bool versions_noted = false; // the accepting end's application ids, when this end connected
};

std::mutex mtx;
guard_policy policy{default_cap, {}, {}, 0, 0};
std::map<std::string, std::string> bound; // node id -> "CN (sha256:...)"
std::map<std::string, std::string> bound_who; // node id -> "'CN' (role)"
refusal_listener listener;                    // the driver's event log
std::map<std::string, std::vector<std::string>> versions; // "ip:port" -> its application ids
std::map<std::string, uint64_t> counts;

std::string fingerprint(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!cert || !X509_digest(cert, EVP_sha256(), md, &len))
    return "no certificate";
  std::string hex;
  for (unsigned i = 0; i < len; ++i)
    hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  char ip[INET6_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return "unknown peer";
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    return fmt::format("{}:{}", ip, ntohs(in->sin_port));
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
  return fmt::format("[{}]:{}", ip, ntohs(in6->sin6_port));
}

// At most 20 lines a minute, then how many were left out.
line_budget refusal_lines;

std::string hex_node(const std::string& node) {
  // CAF prints a node id as its host hash in hex and its pid ("HOST#PID")
  if (node.size() != 32)
    return "an invalid node id";
  std::string hex;
  for (size_t i = 12; i < 32; ++i)
    hex += fmt::format("{:02X}", static_cast<uint8_t>(node[i]));
  uint32_t pid = 0;
  for (size_t i = 8; i < 12; ++i)
    pid = (pid << 8) | static_cast<uint8_t>(node[i]);
  return fmt::format("{}#{}", hex, pid);
}

// A connection's guard lives with its SSL (ex_data, freed with it): the read path finds it
// without a lock, since only the thread that reads a connection feeds its guard.
void free_connection(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<connection*>(ptr);
}

int connection_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, &free_connection);
  return index;
}

connection& connection_of(SSL* ssl) {
  if (auto* c = static_cast<connection*>(SSL_get_ex_data(ssl, connection_index())))
    return *c;
  auto c = std::make_unique<connection>();
  X509* cert = SSL_get_peer_certificate(ssl);
  std::string cn = cert ? common_name_of(cert) : "no certificate";
  c->who = cert ? fmt::format("'{}' ({})", cn, to_string(role_of(cert))) : "a peer without certificate";
  c->cert = certificate_id(cert);
  if (cert)
    X509_free(cert);
  auto claimed_by = c->cert;
  auto who = c->who;
  c->guard = std::make_unique<basp_guard>(
      policy, SSL_is_server(ssl) == 1, [claimed_by, who](const std::string& node) -> std::string {
        std::lock_guard g{mtx};
        auto [it, fresh] = bound.emplace(node, claimed_by);
        if (fresh)
          bound_who.emplace(node, who);
        if (fresh || it->second == claimed_by)
          return {};
        return fmt::format("a handshake claiming node id {}, which certificate {} holds",
                           hex_node(node), it->second);
      });
  SSL_set_ex_data(ssl, connection_index(), c.get());
  return *c.release();
}

} // namespace

std::string certificate_id(X509* cert) {
  if (!cert)
    return "no certificate";
  return fmt::format("'{}' (sha256 {})", common_name_of(cert), fingerprint(cert));
}

std::string certificate_id_of_file(const std::string& pem) {
  std::unique_ptr<FILE, int (*)(FILE*)> f{std::fopen(pem.c_str(), "r"), &std::fclose};
  if (!f)
    return {};
  std::unique_ptr<X509, void (*)(X509*)> cert{PEM_read_X509(f.get(), nullptr, nullptr, nullptr),
                                              &X509_free};
  return cert ? certificate_id(cert.get()) : std::string{};
}

void set_this_node(const std::string& node, uint64_t spawn_server, uint64_t link_atom,
                   uint64_t unlink_atom) {
  std::lock_guard g{mtx};
  policy.this_node = node;
  policy.named_actors = {spawn_server};
  policy.link_atom = link_atom;
  policy.unlink_atom = unlink_atom;
}

void set_payload_cap(uint64_t bytes) {
  std::lock_guard g{mtx};
  policy.max_payload = std::max(bytes, default_cap);
}

uint64_t payload_cap() {
  std::lock_guard g{mtx};
  return policy.max_payload;
}

// CAF_HVD_WIRE_GUARD=off turns the guard off, for bench/wire_guard.py's side-by-side
// figures only: said on stderr once.
bool guard_off() {
  static const bool off = [] {
    const char* v = std::getenv("CAF_HVD_WIRE_GUARD");
    bool o = v && std::string(v) == "off";
    if (o)
      std::fprintf(stderr, "caf-hvd: WARNING: the wire guard is off (CAF_HVD_WIRE_GUARD=off: "
                           "for benchmarks only; any peer reaches any actor)\n");
    return o;
  }();
  return off;
}

std::string inbound(SSL* ssl, const void* data, int n) {
  // No lock on this path: the policy is set before any connection, and a connection's
  // guard is fed only by the thread that reads it. The shared maps take mtx.
  auto& c = connection_of(ssl);
  // The accepting end's application ids, once: CAF refuses other versions with a bare
  // error code, and the connect's error names both versions from them.
  auto note_versions = [&] {
    if (c.versions_noted || c.guard->peer_applications().empty())
      return;
    c.versions_noted = true;
    std::lock_guard g{mtx};
    if (versions.size() > 4096)
      versions.clear();
    versions[peer_address(SSL_get_fd(ssl))] = c.guard->peer_applications();
  };
  if (guard_off()) {
    // off: only the handshake is read, for the binding that tickets name
    if (c.guard->peer_node().empty())
      c.guard->feed(static_cast<const uint8_t*>(data), static_cast<size_t>(n));
    note_versions();
    return {};
  }
  auto why = c.guard->feed(static_cast<const uint8_t*>(data), static_cast<size_t>(n));
  note_versions();
  if (why.empty() || c.logged)
    return why;
  c.logged = true;
  auto who = c.who;
  uint64_t count = 0;
  refusal_listener tell;
  {
    std::lock_guard g{mtx};
    count = ++counts[who];
    tell = listener;
  }
  auto address = peer_address(SSL_get_fd(ssl));
  if (tell)
    tell(who, address, why, count);
  uint64_t left_out = 0;
  if (refusal_lines.take(left_out)) {
    if (left_out)
      std::fprintf(stderr, "caf-hvd: %llu further wire refusals were not logged\n",
                   static_cast<unsigned long long>(left_out));
    std::fprintf(stderr, "caf-hvd: refused %s from %s: %s; connection closed\n", who.c_str(),
                 address.c_str(), why.c_str());
  }
  return why;
}

void forget(SSL* ssl) {
  // the connection is freed with its SSL (free_connection); forgetting it early keeps a
  // reused SSL from meeting an old guard
  if (auto* c = static_cast<connection*>(SSL_get_ex_data(ssl, connection_index()))) {
    SSL_set_ex_data(ssl, connection_index(), nullptr);
    delete c;
  }
}

std::string certificate_of(const std::string& node) {
  std::lock_guard g{mtx};
  auto it = bound.find(node);
  return it == bound.end() ? std::string{} : it->second;
}

std::string peer_of(const std::string& node) {
  std::lock_guard g{mtx};
  auto it = bound_who.find(node);
  return it == bound_who.end() ? std::string{} : it->second;
}

void on_refusal(refusal_listener l) {
  std::lock_guard g{mtx};
  listener = std::move(l);
}

std::vector<std::string> versions_of(const std::string& peer) {
  std::lock_guard g{mtx};
  auto it = versions.find(peer);
  return it == versions.end() ? std::vector<std::string>{} : it->second;
}

std::map<std::string, uint64_t> refusals() {
  std::lock_guard g{mtx};
  return counts;
}

} // namespace cafhvd::wire
