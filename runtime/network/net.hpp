// caf-hvd's network side is a module, caf-hvd-net.so, loaded the first time a command
// needs it: CAF's middleman and OpenSSL module, OpenSSL itself, the cluster credentials,
// the TLS context and hooks (net/). `caf-hvd run` and the other local commands never load
// it: resolving those libraries' symbols took about 4 ms of every start (BENCHMARKS.md,
// "The launcher's own cost"). A driver or node agent loads it before its actor system
// starts; `run` only for a Horovod elastic job's signed notifications.
//
// The binary reaches the module through this table only, so nothing it links names a
// symbol of those libraries (the link fails if something does).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>

#include "runtime/cluster/credential_files.hpp"

namespace cafhvd::net {

/// Changes whenever the table below changes: a module from another build is refused.
inline constexpr uint32_t abi_version = 4;

struct api {
  uint32_t abi = abi_version;
  uint32_t size = sizeof(api);

  // --- the actor system's network (actors/config.cpp, the driver, the node agent)
  /// Heartbeats and link timeout, CAF's middleman; with credentials also CAF's OpenSSL
  /// module in mutual-TLS mode, with the process's shared TLS context installed.
  void (*enable_network)(caf::actor_system_config& cfg, std::chrono::milliseconds heartbeat,
                         std::chrono::milliseconds timeout, const cluster_credentials* creds);
  /// Makes `creds` the process's TLS context (a node agent again on SIGHUP).
  void (*install_tls)(const cluster_credentials& creds);
  /// The actor that connects to node agents: the OpenSSL module's with `tls`, else the
  /// middleman's (which also spawns actors on connected nodes).
  caf::actor (*connector)(caf::actor_system& sys, bool tls);
  /// Opens the node agent's port (0: any) on `bind` (empty: every address), publishing
  /// `published` there (a connect to the port answers with its handle; may be null).
  caf::expected<uint16_t> (*open)(caf::actor_system& sys, uint16_t port, const std::string& bind,
                                  bool tls, const caf::actor& published);
  /// Why the TLS handshake with `peer` ("ip:port") failed, or empty.
  std::string (*tls_failure_for)(const std::string& peer);

  // --- cluster credentials (net/credentials.hpp has what each does)
  void (*init_cluster)(const std::string& dir);
  std::string (*issue_credentials)(const std::string& dir, cert_role role,
                                   const std::string& name, const std::string& out);
  std::vector<std::string> (*revoke_credentials)(const std::string& dir, const std::string& name);
  cluster_credentials (*load_cluster)(const std::string& dir, cert_role role);
  /// Signed statements (runtime/cluster/credential_files.hpp): sign with `creds`' key; check one
  /// against `creds`' cluster (throws credentials_error saying why it fails).
  signed_ticket (*sign_ticket)(const cluster_credentials& creds, const std::string& body);
  ticket_holder (*check_ticket)(const cluster_credentials& creds, const signed_ticket& t,
                                cert_role role, const std::string& purpose,
                                const std::string& audience);
  /// Why `creds`' certificate cannot join a cluster (a node certificate issued before
  /// joining existed), or empty.
  std::string (*join_problem)(const cluster_credentials& creds);

  // --- Horovod's signed wire (runtime/horovod/horovod_wire.cpp)
  /// HMAC-SHA256 of `body` under `key` (32 bytes).
  std::string (*hmac_sha256)(std::string_view key, std::string_view body);
  /// Whether two digests of equal length are equal, in constant time.
  bool (*digests_equal)(std::string_view a, std::string_view b);

  // --- the wire guard (runtime/network/basp_guard.hpp, net/wire_guard.hpp)
  /// The largest message payload a peer may send (bytes; never below the default:
  /// an executor frame of the default limit and its call).
  void (*set_wire_cap)(uint64_t bytes);
  uint64_t (*wire_cap)();
  /// The certificate a peer's node id is bound to in this process ("'CN' (sha256 HEX)"),
  /// or empty when no connection claimed it.
  std::string (*certificate_of)(const caf::node_id& node);
  /// How `creds`' own certificate is named there (a ticket's audience names the agent
  /// by its node id and this).
  std::string (*own_certificate)(const cluster_credentials& creds);
  /// Connections closed for breaking the wire's rules, per certificate ("'CN' (role)").
  std::map<std::string, uint64_t> (*wire_refusals)();
  /// The application ids (caf-hvd's protocol version) that the agent at `peer`
  /// ("ip:port") named in its handshake when this process last connected, or none.
  std::vector<std::string> (*peer_versions)(const std::string& peer);
  /// The certificate a peer's node id is bound to, as refusals name it ("'CN' (role)"),
  /// or empty.
  std::string (*peer_of)(const caf::node_id& node);
  /// Called (on a network thread) for each connection the guard closes: the certificate
  /// ("'CN' (role)"), the peer's address, the rule, that certificate's refusals so far.
  void (*on_wire_refusal)(std::function<void(const std::string& who, const std::string& address,
                                             const std::string& why, uint64_t count)>
                              listener);
};

/// The module's table, loading the module on the first call (thread-safe). Looks next to
/// the running binary (a build tree), then in the installed module directory. Throws
/// std::runtime_error naming where it looked and why it failed.
const api& module();

} // namespace cafhvd::net

/// The module's entry point; test programs that link net/ statically define it too.
extern "C" const cafhvd::net::api* cafhvd_net_api();
