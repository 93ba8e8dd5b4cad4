// The shared TLS context: built with the real OpenSSL functions (the binary interposes
// some of them for CAF's module), a verify callback for roles and revocation, and the
// reasons of refused handshakes kept for the messages.
#include "net/tls_context.hpp"

#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

namespace cafhvd::tls {

namespace {

// What a context of ours knows about itself (kept in its ex_data).
struct context_info {
  cert_role own;
  std::function<void(const std::string&)> warn;
};

void free_info(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<context_info*>(ptr);
}

void free_string(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<std::string*>(ptr);
}

int context_index() {
  static int idx = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, free_info);
  return idx;
}

int refusal_index() {
  static int idx = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_string);
  return idx;
}

// Past the binary's own SSL_CTX_new, which hands out the shared context.
SSL_CTX* new_plain_context() {
  using fn = SSL_CTX* (*)(const SSL_METHOD*);
  static fn real = [] {
    auto f = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "SSL_CTX_new"));
    return f ? f : &SSL_CTX_new;
  }();
  return real(TLS_method());
}

std::string common_name(X509* cert) {
  if (!cert)
    return "?";
  char buf[256] = "?";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof(buf));
  return buf;
}

std::string serial_of(X509* cert) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr);
  char* hex = BN_bn2hex(bn);
  std::string out = hex ? hex : "?";
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

const char* wanted_peer(cert_role own) {
  return own == cert_role::node ? "a driver" : "a node agent";
}

std::string describe(int err, X509* cert, int depth, cert_role own) {
  auto who = fmt::format("certificate '{}'", common_name(cert));
  switch (err) {
  case X509_V_ERR_CERT_REVOKED:
    return fmt::format("{} (serial {}) is revoked by the cluster's crl.pem", who, serial_of(cert));
  case X509_V_ERR_INVALID_PURPOSE:
    if (depth == 0)
      return fmt::format("{} is a {} certificate; {}", who, to_string(role_of(cert)),
                         own == cert_role::node
                             ? "only drivers and joining node agents (node certificates issued "
                               "for joining) may connect to a node agent; a node certificate "
                               "issued before joining existed serves only: re-issue it with "
                               "'caf-hvd cluster revoke NAME' and 'caf-hvd cluster add-node NAME'"
                             : "a driver connects only to node agents (node certificates)");
    break;
  case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
  case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
  case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
  case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
  case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
  case X509_V_ERR_CERT_SIGNATURE_FAILURE:
    return fmt::format("{} is not signed by this cluster's CA (a member of another cluster?)", who);
  case X509_V_ERR_CERT_HAS_EXPIRED:
    return fmt::format("{} has expired", who);
  case X509_V_ERR_UNABLE_TO_GET_CRL:
    return fmt::format("no revocation list of the cluster's CA to check {} against", who);
  default:
    break;
  }
  return fmt::format("{}: {}", who, X509_verify_cert_error_string(err));
}

void set_refusal(SSL* ssl, std::string why) {
  delete static_cast<std::string*>(SSL_get_ex_data(ssl, refusal_index()));
  SSL_set_ex_data(ssl, refusal_index(), new std::string(std::move(why)));
}

int verify(int ok, X509_STORE_CTX* store) {
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  if (!ssl)
    return ok;
  auto* info =
      static_cast<context_info*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), context_index()));
  if (!info)
    return ok;
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  int depth = X509_STORE_CTX_get_error_depth(store);
  if (!ok) {
    set_refusal(ssl, describe(X509_STORE_CTX_get_error(store), cert, depth, info->own));
    return 0;
  }
  if (depth != 0)
    return 1;
  auto peer = role_of(cert);
  if (peer == cert_role::member) {
    // Pre-role member certificates keep working; say so once per certificate.
    static std::mutex mtx;
    static std::set<std::string> warned;
    auto serial = serial_of(cert);
    bool first = false;
    {
      std::lock_guard guard{mtx};
      first = warned.insert(serial).second;
    }
    if (first && info->warn)
      info->warn(fmt::format(
          "WARNING: {} presented a pre-role member certificate ('{}', serial {}), which can act "
          "as driver and as node; re-issue it with 'caf-hvd cluster add-node' or 'add-driver' "
          "and revoke the old one",
          wanted_peer(info->own), common_name(cert), serial));
    return 1;
  }
  if (info->own == cert_role::member)
    return 1;
  // A node agent accepts drivers and joining agents (a node certificate that passed
  // OpenSSL's client purpose check: one issued for joining); when it connects itself (to
  // join), it connects only to node agents. A driver connects only to node agents.
  bool accepting = SSL_is_server(ssl) == 1;
  bool fine = info->own == cert_role::node && accepting
                  ? peer == cert_role::driver || peer == cert_role::node
                        || peer == cert_role::admin
                  : peer == cert_role::node;
  if (!fine) {
    set_refusal(ssl, describe(X509_V_ERR_INVALID_PURPOSE, cert, 0, info->own));
    X509_STORE_CTX_set_error(store, X509_V_ERR_INVALID_PURPOSE);
    return 0;
  }
  return 1;
}

std::mutex shared_mtx;
SSL_CTX* shared_ctx = nullptr;

std::mutex failures_mtx;
std::map<std::string, std::string> failures;

} // namespace

SSL_CTX* build_context(const context_spec& spec) {
  const auto& c = spec.creds;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx{new_plain_context(), SSL_CTX_free};
  if (!ctx)
    throw credentials_error("cannot create a TLS context: " + openssl_error());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), c.cert.c_str()) != 1)
    throw credentials_error(fmt::format("cannot load {}: {}", c.cert, openssl_error()));
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), c.key.c_str(), SSL_FILETYPE_PEM) != 1
      || SSL_CTX_check_private_key(ctx.get()) != 1)
    throw credentials_error(fmt::format("cannot load {}: {}", c.key, openssl_error()));
  if (SSL_CTX_load_verify_locations(ctx.get(), c.ca_cert.c_str(), nullptr) != 1)
    throw credentials_error(fmt::format("cannot load {}: {}", c.ca_cert, openssl_error()));
  if (!c.crl.empty()) {
    FILE* f = std::fopen(c.crl.c_str(), "r");
    if (!f)
      throw credentials_error(fmt::format("cannot read {}: {}", c.crl, std::strerror(errno)));
    auto* store = SSL_CTX_get_cert_store(ctx.get());
    int lists = 0;
    while (X509_CRL* crl = PEM_read_X509_CRL(f, nullptr, nullptr, nullptr)) {
      X509_STORE_add_crl(store, crl);
      X509_CRL_free(crl);
      ++lists;
    }
    std::fclose(f);
    ERR_clear_error(); // the end of the file reads as an error
    if (lists == 0)
      throw credentials_error(fmt::format("{} is not a PEM revocation list", c.crl));
    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify);
  if (SSL_CTX_set_cipher_list(ctx.get(), "HIGH:!aNULL:!MD5") != 1)
    throw credentials_error("cannot set the cipher list: " + openssl_error());
  // CAF never resumes a session: tickets and the cache would only cost time.
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_ex_data(ctx.get(), context_index(), new context_info{c.role, spec.warn});
  return ctx.release();
}

void install(const context_spec& spec) {
  auto* ctx = build_context(spec);
  std::lock_guard guard{shared_mtx};
  if (shared_ctx)
    SSL_CTX_free(shared_ctx); // connections made with it hold their own references
  shared_ctx = ctx;
}

SSL_CTX* acquire_shared() {
  std::lock_guard guard{shared_mtx};
  if (shared_ctx)
    SSL_CTX_up_ref(shared_ctx);
  return shared_ctx;
}

bool is_ours(const SSL_CTX* ctx) {
  return ctx && SSL_CTX_get_ex_data(ctx, context_index()) != nullptr;
}

std::string refusal(const SSL* ssl) {
  auto* why = static_cast<std::string*>(SSL_get_ex_data(ssl, refusal_index()));
  return why ? *why : std::string{};
}

void record_failure(const std::string& peer, const std::string& why) {
  std::lock_guard guard{failures_mtx};
  if (failures.size() > 4096)
    failures.clear();
  failures[peer] = why;
}

std::string failure_for(const std::string& peer) {
  std::lock_guard guard{failures_mtx};
  auto i = failures.find(peer);
  return i == failures.end() ? std::string{} : i->second;
}

std::string explain_alert(unsigned long err) {
  if (ERR_GET_LIB(err) != ERR_LIB_SSL)
    return {};
  switch (ERR_GET_REASON(err)) {
  case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    return "the node agent refused this driver's certificate: the cluster revoked it (ask "
           "the cluster's administrator for a new one: 'caf-hvd cluster add-driver NAME')";
  case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    return "the node agent refused this driver's certificate: it is not a driver "
           "certificate (node agents admit drivers only)";
  case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    return "the node agent does not trust this driver's certificate: it is not signed by "
           "the agent's cluster CA (another cluster?)";
  case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    return "the node agent refused this driver's certificate: it has expired";
  case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
  case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    return "the node agent refused this driver's certificate";
  default:
    return {};
  }
}

} // namespace cafhvd::tls
