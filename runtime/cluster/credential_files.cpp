// The binary's own part of the cluster credentials: where they are and the roles' names
// (the OpenSSL work is in net/credentials.cpp, in the network module).
#include "runtime/cluster/credential_files.hpp"

#include <cstdlib>

#include <fmt/format.h>

namespace cafhvd {

std::string cluster_dir(const std::optional<std::string>& flag) {
  if (flag && !flag->empty())
    return *flag;
  if (const char* env = std::getenv("CAF_HVD_CLUSTER_DIR"); env && *env)
    return env;
  const char* home = std::getenv("HOME");
  return fmt::format("{}/.config/caf-hvd/cluster", home && *home ? home : ".");
}

std::string colocator_audience(const std::string& node_id, const std::string& certificate) {
  return node_id + " " + certificate;
}

std::string ticket_body(const std::string& purpose, const std::string& audience,
                        const std::string& subject, long unix_seconds) {
  return fmt::format("caf-hvd ticket 1\n{}\n{}\n{}\n{}\n", purpose, audience, subject,
                     unix_seconds);
}

const char* to_string(cert_role r) {
  switch (r) {
  case cert_role::node:
    return "node";
  case cert_role::driver:
    return "driver";
  case cert_role::admin:
    return "admin";
  default:
    return "member";
  }
}

} // namespace cafhvd
