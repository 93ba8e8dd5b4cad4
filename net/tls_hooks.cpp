// caf-hvd's hooks into CAF's OpenSSL module. The module resolves these OpenSSL functions
// to caf-hvd-net.so's own (the network module is loaded first in its own lookup scope,
// before libcaf_openssl and OpenSSL: apps/meson.build); each calls OpenSSL's (the next
// definition, dlsym RTLD_NEXT) and adds what the module lacks:
//
// - A shared context. The module builds a new SSL_CTX from the files for every
//   connection (1.7 ms per side) and has no verify hook: SSL_CTX_new hands it the
//   process's one context instead (net/tls_context: built once, roles and revocation
//   checked in the handshake), and the module's calls that would configure it
//   (certificate, key, CA, verify mode, ciphers) leave it as it is.
// - No spinning through handshakes (await_handshake_data below).
// - Refusals named. The module drops peers that fail the handshake silently (Debian
//   builds CAF with its logging compiled out): SSL_accept logs them with the verify
//   callback's reason; on the connecting side the reason is kept for the driver's error.
// - A handshake deadline. The module has none (a client that connects and sends nothing
//   holds its connection, and a few hundred of them lock legitimate drivers out): a
//   reaper shuts down accepted connections whose handshake has not finished after 5 s,
//   which makes CAF's next SSL_accept on them fail and the module close them.
// - A clean error queue. The wrappers (SSL_accept, SSL_connect, SSL_read, SSL_write)
//   empty the thread's OpenSSL error queue before each call, as OpenSSL requires. CAF
//   drains the queue only inside a log statement, which Debian's build compiles out, so
//   one failed handshake left an error behind and the next SSL_get_error on the same
//   thread, for a healthy connection, reported it: garbage sent to a node's port could
//   cut the driver off.
#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <dlfcn.h>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>
#include <netinet/in.h>
#include <string>
#include <poll.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "net/tls_context.hpp"
#include "net/wire_guard.hpp"
#include "runtime/observe/line_budget.hpp"

namespace {

// At most 20 lines per minute, then a count, so a flood cannot fill the log.
cafhvd::line_budget refusal_lines;

struct pending_handshake {
  int fd;
  std::string peer; // getpeername at first sight, to recognise the socket later
  std::chrono::steady_clock::time_point since;
};

std::mutex pending_mtx;
std::map<SSL*, pending_handshake> pending;

std::string peer_key(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return {};
  return std::string(reinterpret_cast<const char*>(&ss), len);
}

void reaper() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto now = std::chrono::steady_clock::now();
    std::lock_guard guard{pending_mtx};
    for (auto it = pending.begin(); it != pending.end();) {
      if (now - it->second.since < std::chrono::seconds(5)) {
        ++it;
        continue;
      }
      // Only if the descriptor still is that connection (CAF may have closed it).
      if (peer_key(it->second.fd) == it->second.peer)
        shutdown(it->second.fd, SHUT_RDWR);
      it = pending.erase(it);
    }
  }
}

void track(SSL* ssl, bool done) {
  static std::once_flag started;
  std::call_once(started, [] { std::thread{reaper}.detach(); });
  std::lock_guard guard{pending_mtx};
  if (done) {
    pending.erase(ssl);
    return;
  }
  if (!pending.count(ssl)) {
    int fd = SSL_get_fd(ssl);
    pending.emplace(ssl, pending_handshake{fd, peer_key(fd), std::chrono::steady_clock::now()});
  }
}

// "ip:port" of a socket's peer ("[ip]:port" for IPv6), or "unknown peer".
std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return "unknown peer";
  char ip[INET6_ADDRSTRLEN] = {};
  char out[INET6_ADDRSTRLEN + 10];
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    std::snprintf(out, sizeof(out), "%s:%u", ip, ntohs(in->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    bool mapped = IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr); // a dual-stack port's IPv4 peer
    if (mapped)
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, sizeof(ip));
    else
      inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    std::snprintf(out, sizeof(out), mapped ? "%s:%u" : "[%s]:%u", ip, ntohs(in6->sin6_port));
  } else {
    return "unknown peer";
  }
  return out;
}

// On the connecting side a refusal shows in SSL_connect (this process refused the peer's
// certificate) or, with TLS 1.3, in the first read (the peer's alert about ours).
// The peer is named when the connection starts: once the agent has refused us and reset
// the connection, getpeername no longer knows it.
std::mutex client_peers_mtx;
std::map<SSL*, std::string> client_peers;

void remember_client_peer(SSL* ssl) {
  std::lock_guard guard{client_peers_mtx};
  if (!client_peers.count(ssl))
    client_peers.emplace(ssl, peer_name(SSL_get_fd(ssl)));
}

void forget_client_peer(SSL* ssl) {
  std::lock_guard guard{client_peers_mtx};
  client_peers.erase(ssl);
}

void note_client_failure(SSL* ssl, int rc) {
  if (SSL_is_server(ssl))
    return;
  int err = SSL_get_error(ssl, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_ZERO_RETURN)
    return;
  auto why = cafhvd::tls::refusal(ssl);
  if (why.empty())
    why = cafhvd::tls::explain_alert(ERR_peek_last_error());
  if (why.empty())
    return;
  std::string peer;
  {
    std::lock_guard guard{client_peers_mtx};
    if (auto it = client_peers.find(ssl); it != client_peers.end())
      peer = it->second;
  }
  cafhvd::tls::record_failure(peer.empty() ? peer_name(SSL_get_fd(ssl)) : peer, why);
}

// CAF's BASP queues its greeting on a connection at once, so the module keeps the socket
// registered for writing while the TLS handshake still waits for the peer's next flight;
// every write event calls SSL_accept/SSL_connect again, which wants to read: the
// multiplexer spins for whole round trips (measured: 50-2,000 calls and 5-10 ms of CPU
// per handshake, and on a shared machine those spins starve the very peers they wait
// for). Instead the thread waits, once per round of its multiplexer loop, until one of
// its handshakes has bytes to read, for at most 0.2 ms. A round is recognised by a
// handshake being called a second time since the last wait. One wait per round, not
// per call: with hundreds of connections that never send a byte (a flood) the loop
// still goes round every few milliseconds and keeps accepting; a wait per call slept
// through most of each round and took in 30 connections a second, so a driver's
// connection queued behind 600 of them missed its handshake deadline for 20 s and more.
struct handshake_waits {
  std::map<SSL*, int> fds; // this thread's handshakes that want to read
  std::set<SSL*> called;   // those called since the thread last waited
};

handshake_waits& waits() {
  static thread_local handshake_waits w;
  return w;
}

void handshake_settled(SSL* ssl) {
  auto& w = waits();
  w.fds.erase(ssl);
  w.called.erase(ssl);
}

void await_handshake_data(SSL* ssl) {
  constexpr auto longest = std::chrono::microseconds(200);
  constexpr size_t most = 1024; // beyond this, a poll costs more than the spin it saves
  auto& w = waits();
  w.fds[ssl] = SSL_get_fd(ssl);
  if (w.called.insert(ssl).second)
    return; // the round goes on
  w.called.clear();
  w.called.insert(ssl);
  if (w.fds.size() > most)
    return;
  std::vector<pollfd> ps;
  ps.reserve(w.fds.size());
  for (auto& [s, fd] : w.fds)
    ps.push_back({fd, POLLIN, 0});
  timespec ts{0, std::chrono::duration_cast<std::chrono::nanoseconds>(longest).count()};
  ::ppoll(ps.data(), ps.size(), &ts, nullptr);
  // A connection CAF closed without finishing its handshake leaves a closed descriptor.
  // (ps is in the map's order)
  auto p = ps.begin();
  for (auto it = w.fds.begin(); it != w.fds.end(); ++p)
    it = p->revents & POLLNVAL ? w.fds.erase(it) : std::next(it);
}

template <class Fn> Fn real_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

} // namespace

extern "C" SSL_CTX* SSL_CTX_new(const SSL_METHOD* method) {
  static auto real = real_fn<SSL_CTX* (*)(const SSL_METHOD*)>("SSL_CTX_new");
  if (auto* shared = cafhvd::tls::acquire_shared())
    return shared;
  return real(method);
}

extern "C" int SSL_CTX_use_certificate_chain_file(SSL_CTX* ctx, const char* file) {
  static auto real = real_fn<int (*)(SSL_CTX*, const char*)>("SSL_CTX_use_certificate_chain_file");
  return cafhvd::tls::is_ours(ctx) ? 1 : real(ctx, file);
}

extern "C" int SSL_CTX_use_PrivateKey_file(SSL_CTX* ctx, const char* file, int type) {
  static auto real = real_fn<int (*)(SSL_CTX*, const char*, int)>("SSL_CTX_use_PrivateKey_file");
  return cafhvd::tls::is_ours(ctx) ? 1 : real(ctx, file, type);
}

extern "C" int SSL_CTX_load_verify_locations(SSL_CTX* ctx, const char* file, const char* path) {
  static auto real =
      real_fn<int (*)(SSL_CTX*, const char*, const char*)>("SSL_CTX_load_verify_locations");
  return cafhvd::tls::is_ours(ctx) ? 1 : real(ctx, file, path);
}

extern "C" void SSL_CTX_set_verify(SSL_CTX* ctx, int mode, SSL_verify_cb cb) {
  static auto real = real_fn<void (*)(SSL_CTX*, int, SSL_verify_cb)>("SSL_CTX_set_verify");
  if (!cafhvd::tls::is_ours(ctx))
    real(ctx, mode, cb);
}

extern "C" int SSL_CTX_set_cipher_list(SSL_CTX* ctx, const char* list) {
  static auto real = real_fn<int (*)(SSL_CTX*, const char*)>("SSL_CTX_set_cipher_list");
  return cafhvd::tls::is_ours(ctx) ? 1 : real(ctx, list);
}

// A connection closed before its handshake finished is forgotten with its SSL.
extern "C" void SSL_free(SSL* ssl) {
  static auto real = real_fn<void (*)(SSL*)>("SSL_free");
  if (ssl) {
    handshake_settled(ssl);
    forget_client_peer(ssl);
    cafhvd::wire::forget(ssl);
    std::lock_guard guard{pending_mtx};
    pending.erase(ssl);
  }
  real(ssl);
}

extern "C" int SSL_connect(SSL* ssl) {
  using fn = int (*)(SSL*);
  static fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "SSL_connect"));
  ERR_clear_error();
  remember_client_peer(ssl);
  int rc = real(ssl);
  if (rc > 0) {
    handshake_settled(ssl);
    return rc;
  }
  if (SSL_get_error(ssl, rc) == SSL_ERROR_WANT_READ) {
    await_handshake_data(ssl);
    return rc;
  }
  handshake_settled(ssl);
  note_client_failure(ssl, rc);
  return rc;
}

extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  using fn = int (*)(SSL*, void*, int);
  static fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "SSL_read"));
  ERR_clear_error();
  int rc = real(ssl, buf, num);
  if (rc <= 0) {
    note_client_failure(ssl, rc);
    return rc;
  }
  // The wire guard (net/wire_guard.hpp) sees every byte before CAF does; a connection
  // that broke its rules fails this read and every later one (its refusal sticks), and
  // CAF closes it on the failed read.
  if (!cafhvd::wire::inbound(ssl, buf, rc).empty()) {
    shutdown(SSL_get_fd(ssl), SHUT_RDWR);
    return -1;
  }
  return rc;
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  using fn = int (*)(SSL*, const void*, int);
  static fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "SSL_write"));
  ERR_clear_error();
  int rc = real(ssl, buf, num);
  if (rc <= 0)
    note_client_failure(ssl, rc);
  return rc;
}

extern "C" int SSL_accept(SSL* ssl) {
  using fn = int (*)(SSL*);
  static fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "SSL_accept"));
  ERR_clear_error();
  int rc = real(ssl);
  if (rc > 0) {
    handshake_settled(ssl);
    track(ssl, true);
    return rc;
  }
  int err = SSL_get_error(ssl, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    track(ssl, false);
    if (err == SSL_ERROR_WANT_READ)
      await_handshake_data(ssl);
    return rc;
  }
  handshake_settled(ssl);
  track(ssl, true);
  auto peer = peer_name(SSL_get_fd(ssl));
  auto code = ERR_peek_last_error();
  // A peer that connects and leaves without a byte (a driver's reachability check, a
  // port scan) is not an admission attempt: OpenSSL reports an unexpected EOF, or, when
  // the close arrives with the first read, no error at all.
  if (code == 0 || ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
    return rc;
  char reason[256];
  ERR_error_string_n(code, reason, sizeof(reason));
  auto why = cafhvd::tls::refusal(ssl);
  uint64_t suppressed = 0;
  if (refusal_lines.take(suppressed)) {
    if (suppressed)
      std::fprintf(stderr, "caf-hvd node: %llu further refusals were not logged\n",
                   static_cast<unsigned long long>(suppressed));
    if (!why.empty())
      std::fprintf(stderr, "caf-hvd node: refused %s: %s\n", peer.c_str(), why.c_str());
    else
      std::fprintf(stderr, "caf-hvd node: refused %s: TLS handshake failed (%s)\n", peer.c_str(),
                   reason);
  }
  return rc;
}
