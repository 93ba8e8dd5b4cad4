// The process's one TLS context for its cluster connections. CAF 0.17's OpenSSL module
// builds a new SSL_CTX from the certificate, key and CA files for every connection (about
// 1.7 ms of its single multiplexer thread each) and offers no verify hook; caf-hvd's network
// module hands it this shared context instead (net/tls_hooks.cpp), built once, which checks the
// peer's role and the cluster's revocation list in the handshake and remembers why a
// handshake failed so the error can name it.
#pragma once

#include <functional>
#include <string>

#include <openssl/ssl.h>

#include "net/credentials.hpp"

namespace cafhvd::tls {

struct context_spec {
  cluster_credentials creds;
  /// Called (from the thread doing the handshake) once per peer certificate that is a
  /// pre-role member certificate, and for other notices worth a line on stderr.
  std::function<void(const std::string&)> warn;
};

/// Builds a context as the shared one would be (tests use it on both ends of a
/// handshake). Throws credentials_error when the files do not load.
SSL_CTX* build_context(const context_spec& spec);

/// Makes `spec`'s context the process's shared one (replacing an earlier one; connections
/// made before keep theirs). Throws credentials_error, keeping the earlier one.
void install(const context_spec& spec);

/// The shared context with a reference taken for the caller, or nullptr when none is
/// installed.
SSL_CTX* acquire_shared();

/// Whether `ctx` is a context built here (CAF's attempts to configure it are ignored).
bool is_ours(const SSL_CTX* ctx);

/// Why the peer's certificate was refused on `ssl`, or empty.
std::string refusal(const SSL* ssl);

/// A failed handshake's cause for the driver's messages, recorded by peer "ip:port".
void record_failure(const std::string& peer, const std::string& why);
std::string failure_for(const std::string& peer);

/// An alert a node agent sent about this driver's certificate, put in words ("the node
/// agent refused this driver's certificate: the cluster revoked it ..."), or empty when
/// `err` (an OpenSSL error code) is no such alert. Only drivers connect.
std::string explain_alert(unsigned long err);

} // namespace cafhvd::tls
