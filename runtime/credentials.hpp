// Cluster credentials: a cluster's own CA and the member certificate that node agents
// and drivers present to each other in mutual TLS. Created by `caf-hvd cluster init`,
// checked before any actor system starts (CAF's OpenSSL module fails late and obscurely
// on bad files).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace cafhvd {

struct credentials_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Paths of a cluster directory's files.
struct cluster_credentials {
  std::string dir;
  std::string ca_cert;     // ca.pem: the cluster's CA, the only one trusted
  std::string member_cert; // member.pem: presented by agents and drivers
  std::string member_key;  // member.key (mode 0600)
};

/// The directory to use: `flag` if given, else $CAF_HVD_CLUSTER_DIR, else
/// $HOME/.config/caf-hvd/cluster.
std::string cluster_dir(const std::optional<std::string>& flag);

/// Creates DIR (mode 0700) with a new CA (ca.pem, ca.key) and a member certificate
/// (member.pem, member.key) signed by it; keys are written with mode 0600. Refuses to
/// overwrite existing credentials. Returns the paths.
cluster_credentials init_cluster(const std::string& dir);

/// Loads and checks DIR's credentials: files present and readable, key not readable by
/// others, certificate and key matching, certificate signed by the CA and valid now.
/// Throws credentials_error saying what is wrong and how to fix it.
cluster_credentials load_cluster(const std::string& dir);

} // namespace cafhvd
