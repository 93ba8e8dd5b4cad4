// The wire guard on every TLS connection of the process (runtime/network/basp_guard.hpp
// has the rules): the TLS read hook (net/tls_hooks.cpp) feeds it each connection's
// decrypted bytes before CAF sees them, and a connection that breaks a rule is closed.
// Here too: the process-wide binding of node ids to the certificates that first claimed
// them, and the count of refusals per certificate.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <openssl/ssl.h>

struct x509_st;

namespace cafhvd::wire {

/// This process's node id (serialized) and the named actors a peer may reach: set once
/// the actor system exists, before its first connection.
void set_this_node(const std::string& node, uint64_t spawn_server, uint64_t link_atom,
                   uint64_t unlink_atom);

/// The largest payload a peer may send (bytes); at least the default.
void set_payload_cap(uint64_t bytes);
uint64_t payload_cap();

/// Checks `n` bytes that SSL_read returned on `ssl`: "" or why the connection must close
/// (logged and counted here, once per connection).
std::string inbound(SSL* ssl, const void* data, int n);

/// Forgets `ssl` (SSL_free).
void forget(SSL* ssl);

/// The certificate a node id is bound to: "CN (sha256 fingerprint)", or empty when no
/// connection of this process claimed it.
std::string certificate_of(const std::string& node);

/// How a certificate is named in bindings and ticket audiences: "'CN' (sha256 HEX)".
std::string certificate_id(x509_st* cert);
/// ... of the certificate in a PEM file, or empty when it does not load.
std::string certificate_id_of_file(const std::string& pem);

/// The certificate a node id is bound to as refusals name it ("'CN' (role)"), or empty.
std::string peer_of(const std::string& node);

/// Called (outside the guard's lock) for each connection it closes: the certificate
/// ("'CN' (role)"), the peer's address, the rule, and that certificate's refusals so far.
using refusal_listener = std::function<void(const std::string& who, const std::string& address,
                                            const std::string& why, uint64_t count)>;
void on_refusal(refusal_listener listener);

/// The application ids that the agent at `peer` ("ip:port") sent in its handshake when
/// this process last connected to it, or none.
std::vector<std::string> versions_of(const std::string& peer);

/// Refusals so far, per certificate ("CN (role)").
std::map<std::string, uint64_t> refusals();

} // namespace cafhvd::wire
