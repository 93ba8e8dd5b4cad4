// Logs refused TLS connections on a node agent. CAF's OpenSSL module drops peers that
// fail the mutual-TLS handshake silently (Debian builds CAF with its logging compiled
// out) and offers no hook, so caf-hvd exports its own SSL_accept, which the module
// resolves to: it calls OpenSSL's and reports handshakes that fail for good.
#include <arpa/inet.h>
#include <chrono>
#include <cstdio>
#include <dlfcn.h>
#include <mutex>
#include <netinet/in.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace {

// At most 20 lines per minute, then a count, so a flood cannot fill the log.
bool may_log(unsigned& suppressed) {
  static std::mutex mtx;
  static auto window = std::chrono::steady_clock::now();
  static unsigned lines = 0;
  static unsigned dropped = 0;
  std::lock_guard guard{mtx};
  auto now = std::chrono::steady_clock::now();
  if (now - window > std::chrono::minutes(1)) {
    window = now;
    lines = 0;
    suppressed = dropped;
    dropped = 0;
  }
  if (lines >= 20) {
    ++dropped;
    return false;
  }
  ++lines;
  return true;
}

} // namespace

extern "C" int SSL_accept(SSL* ssl) {
  using fn = int (*)(SSL*);
  static fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "SSL_accept"));
  int rc = real(ssl);
  if (rc > 0)
    return rc;
  int err = SSL_get_error(ssl, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
    return rc;
  char peer[INET6_ADDRSTRLEN + 8] = "unknown peer";
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(SSL_get_fd(ssl), reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&ss);
      inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
      std::snprintf(peer, sizeof(peer), "%s:%u", ip, ntohs(in->sin_port));
    } else if (ss.ss_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
      std::snprintf(peer, sizeof(peer), "[%s]:%u", ip, ntohs(in6->sin6_port));
    }
  }
  auto code = ERR_peek_last_error();
  // A peer that connects and leaves without a byte (a driver's reachability check, a
  // port scan) is not an admission attempt.
  if (ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
    return rc;
  char reason[256] = "connection closed during the handshake";
  if (code)
    ERR_error_string_n(code, reason, sizeof(reason));
  unsigned suppressed = 0;
  if (may_log(suppressed)) {
    if (suppressed)
      std::fprintf(stderr, "caf-hvd node: %u further refusals were not logged\n", suppressed);
    std::fprintf(stderr, "caf-hvd node: refused %s: TLS handshake failed (%s)\n", peer, reason);
  }
  return rc;
}
