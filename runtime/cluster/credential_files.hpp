// Cluster credentials: a cluster's own CA and the certificates that node agents and
// drivers present to each other in mutual TLS, each with a role (node or driver), and the
// cluster's revocation list. Created by `caf-hvd cluster init/add-node/add-driver/revoke`,
// checked before any actor system starts (CAF's OpenSSL module fails late and obscurely on
// bad files). This header has what the binary itself needs (the paths and roles); the
// work with OpenSSL is in the network module (net/credentials.hpp, reached through
// runtime/network/net.hpp).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace cafhvd {

struct credentials_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a certificate allows its holder to be. The role is the certificate's extended key
/// usage, so OpenSSL itself refuses a certificate used in the wrong direction: a driver
/// connects (TLS client: clientAuth only), a node agent accepts (TLS server: serverAuth
/// only). A `member` certificate (both usages) is what clusters made before roles got:
/// it still works, with a deprecation warning. An `admin` certificate (TLS client, OU
/// admin) drains and undrains the cluster's nodes; it drives nothing.
enum class cert_role { node, driver, member, admin };

const char* to_string(cert_role r);

/// Paths of the credentials one process uses.
struct cluster_credentials {
  std::string dir;
  std::string ca_cert; // ca.pem: the cluster's CA, the only one trusted
  std::string cert;    // node.pem or driver.pem (member.pem in clusters made before roles)
  std::string key;     // its key (mode 0600)
  std::string crl;     // crl.pem when the cluster has revoked something, else empty
  cert_role role = cert_role::node;
};

/// A statement signed with a cluster member's key, for what CAF cannot tell an actor: who
/// sent a message (CAF authenticates connections, not senders). The holder's certificate
/// travels with it and is checked against the cluster's CA and revocation list.
struct signed_ticket {
  std::string cert;      // the signer's certificate (PEM)
  std::string body;      // what it says: ticket_body() lines
  std::string signature; // ECDSA-SHA256 over body with the certificate's key
};

/// The lines a ticket signs: its purpose (what it admits), its audience (the agent or the
/// cluster that checks it), its subject (the name the signer claims: a node name, a job)
/// and when it was made (Unix seconds; a ticket is good for five minutes either way).
std::string ticket_body(const std::string& purpose, const std::string& audience,
                        const std::string& subject, long unix_seconds);

/// A colocator ticket's audience: the agent's node id and its certificate as its driver's
/// connection saw it ("'CN' (sha256 HEX)").
std::string colocator_audience(const std::string& node_id, const std::string& certificate);

/// Who signed a ticket that checked out.
struct ticket_holder {
  std::string name; // the certificate's name (CN): the owner of a driver's jobs
  cert_role role = cert_role::node;
  std::string subject; // the subject the ticket claims
  // A certificate that `cluster init` made for every host of a single trusted machine
  // (named "node" or "driver"): any host may hold it, so it proves no name.
  bool shared = false;
};

/// The directory to use: `flag` if given, else $CAF_HVD_CLUSTER_DIR, else
/// $HOME/.config/caf-hvd/cluster.
std::string cluster_dir(const std::optional<std::string>& flag);

} // namespace cafhvd
