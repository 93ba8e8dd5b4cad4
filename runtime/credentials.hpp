// Cluster credentials: a cluster's own CA and the certificates that node agents and
// drivers present to each other in mutual TLS, each with a role (node or driver), and the
// cluster's revocation list. Created by `caf-hvd cluster init/add-node/add-driver/revoke`,
// checked before any actor system starts (CAF's OpenSSL module fails late and obscurely on
// bad files).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

struct x509_st; // OpenSSL's X509

namespace cafhvd {

struct credentials_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a certificate allows its holder to be. The role is the certificate's extended key
/// usage, so OpenSSL itself refuses a certificate used in the wrong direction: a driver
/// connects (TLS client: clientAuth only), a node agent accepts (TLS server: serverAuth
/// only). A `member` certificate (both usages) is what clusters made before roles got:
/// it still works, with a deprecation warning.
enum class cert_role { node, driver, member };

const char* to_string(cert_role r);

/// The role a certificate's extended key usage gives it.
cert_role role_of(x509_st* cert);

/// The oldest error in this thread's OpenSSL error queue, as text (and taken off it).
std::string openssl_error();

/// Paths of the credentials one process uses.
struct cluster_credentials {
  std::string dir;
  std::string ca_cert; // ca.pem: the cluster's CA, the only one trusted
  std::string cert;    // node.pem or driver.pem (member.pem in clusters made before roles)
  std::string key;     // its key (mode 0600)
  std::string crl;     // crl.pem when the cluster has revoked something, else empty
  cert_role role = cert_role::node;
};

/// The directory to use: `flag` if given, else $CAF_HVD_CLUSTER_DIR, else
/// $HOME/.config/caf-hvd/cluster.
std::string cluster_dir(const std::optional<std::string>& flag);

/// Creates DIR (mode 0700) with a new CA (ca.pem, ca.key), a node certificate (node.pem,
/// node.key, named "node") and a driver certificate (driver.pem, driver.key, named
/// "driver"), so one directory serves a single trusted machine as before; hosts of a real
/// cluster get their own with issue_credentials. Keys are written with mode 0600. Refuses
/// to overwrite existing credentials.
void init_cluster(const std::string& dir);

/// Issues a certificate of `role` (node or driver) named `name` from DIR's CA into OUT
/// (created, mode 0700): ca.pem, node.pem/node.key or driver.pem/driver.key, and the
/// current crl.pem. OUT is what to copy to that host: it holds no CA key and no other
/// role's key. Records the certificate in DIR/issued.tsv (serial, role, name). Returns OUT.
std::string issue_credentials(const std::string& dir, cert_role role, const std::string& name,
                              const std::string& out);

/// Revokes every certificate issued under `name` (or, when `name` is a path to a
/// certificate file, that certificate: pre-role member certificates are in no index):
/// adds them to DIR/revoked.tsv and writes
/// DIR/crl.pem (signed by the CA), also into the directories issue_credentials wrote
/// under DIR/issued/. Returns the serials revoked (hex).
std::vector<std::string> revoke_credentials(const std::string& dir, const std::string& name);

/// Loads and checks DIR's credentials for a process of `role` (node or driver): files
/// present and readable, key not readable by others, certificate and key matching,
/// certificate signed by the CA, valid now and of that role, the revocation list (if any)
/// signed by the CA. Falls back to a pre-role member.pem. Throws credentials_error saying
/// what is wrong and how to fix it.
cluster_credentials load_cluster(const std::string& dir, cert_role role);

} // namespace cafhvd
