// caf-hvd-net.so's table (runtime/network/net.hpp): everything of caf-hvd that needs CAF's
// middleman, CAF's OpenSSL module or OpenSSL, behind one entry point.
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdexcept>

#include "net/credentials.hpp"
#include "net/tls_context.hpp"
#include "net/wire_guard.hpp"
#include "runtime/network/net.hpp"

namespace cafhvd::net {

namespace {

void install_tls(const cluster_credentials& creds) {
  tls::install({creds, [](const std::string& line) {
                  std::fprintf(stderr, "caf-hvd: %s\n", line.c_str());
                }});
}

void enable_network(caf::actor_system_config& cfg, std::chrono::milliseconds heartbeat,
                    std::chrono::milliseconds timeout, const cluster_credentials* creds) {
  cfg.set("middleman.heartbeat-interval", caf::timespan{heartbeat});
  cfg.set("middleman.connection-timeout", caf::timespan{timeout});
  // Never: it opens a second, unauthenticated plain-TCP port (reference/caf.md §6.5).
  cfg.set("middleman.enable-automatic-connections", false);
  cfg.load<caf::io::middleman>();
  if (creds) {
    // CAF's module needs the paths to turn authentication on; the hooks (tls_hooks.cpp)
    // hand it the shared context built here instead of one per connection.
    cfg.openssl_certificate = creds->cert;
    cfg.openssl_key = creds->key;
    cfg.openssl_cafile = creds->ca_cert;
    install_tls(*creds);
    cfg.load<caf::openssl::manager>();
  }
}

// The wire guard needs this process's node id as CAF writes it, and the atoms it checks.
void guard_this_node(caf::actor_system& sys) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    auto node = sys.node();
    if (auto err = sink(node))
      throw std::runtime_error("cannot serialize this node's id for the wire guard");
    wire::set_this_node(std::string(buf.begin(), buf.end()),
                        static_cast<uint64_t>(caf::atom("SpawnServ")),
                        caf::link_atom::uint_value(), caf::unlink_atom::uint_value());
  });
}

caf::actor connector(caf::actor_system& sys, bool tls) {
  guard_this_node(sys);
  return caf::actor_cast<caf::actor>(tls ? sys.openssl_manager().actor_handle()
                                         : sys.middleman().actor_handle());
}

caf::expected<uint16_t> open(caf::actor_system& sys, uint16_t port, const std::string& bind,
                             bool tls, const caf::actor& published) {
  guard_this_node(sys);
  if (!tls && !published)
    return sys.middleman().open(port, bind.empty() ? nullptr : bind.c_str(), true);
  if (!tls)
    return sys.middleman().publish(published, port, bind.empty() ? nullptr : bind.c_str(), true);
  caf::expected<uint16_t> opened{caf::sec::runtime_error};
  caf::scoped_actor self{sys};
  auto mm = sys.openssl_manager().actor_handle();
  auto on_answer = [&](uint16_t p) { opened = p; };
  auto on_error = [&](caf::error& e) { opened = std::move(e); };
  if (published)
    self->request(mm, std::chrono::seconds(10), caf::publish_atom::value, port,
                  caf::actor_cast<caf::strong_actor_ptr>(published), std::set<std::string>{},
                  bind, true)
        .receive(on_answer, on_error);
  else
    self->request(mm, std::chrono::seconds(10), caf::open_atom::value, port, bind, true)
        .receive(on_answer, on_error);
  return opened;
}

std::string join_problem(const cluster_credentials& creds) {
  std::unique_ptr<FILE, int (*)(FILE*)> f{std::fopen(creds.cert.c_str(), "r"), &std::fclose};
  if (!f)
    return fmt::format("cannot read {}", creds.cert);
  std::unique_ptr<X509, void (*)(X509*)> cert{PEM_read_X509(f.get(), nullptr, nullptr, nullptr),
                                              &X509_free};
  if (!cert)
    return fmt::format("{} is not a PEM certificate", creds.cert);
  if (role_of(cert.get()) == cert_role::member || can_join(cert.get()))
    return {};
  return fmt::format("{} ('{}') was issued before node agents could join a cluster: it serves "
                     "only. Where the cluster was made, run 'caf-hvd cluster revoke {}' and "
                     "'caf-hvd cluster add-node {}', and use the new directory",
                     creds.cert, common_name_of(cert.get()), common_name_of(cert.get()),
                     common_name_of(cert.get()));
}

std::string hmac_sha256(std::string_view key, std::string_view body) {
  static const unsigned char no_key = 0;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  auto* k = key.empty() ? &no_key : reinterpret_cast<const unsigned char*>(key.data());
  if (!HMAC(EVP_sha256(), k, static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(body.data()), body.size(), md, &len)
      || len != 32)
    throw std::runtime_error("HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(md), len);
}

bool digests_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string serialized(const caf::node_id& node) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  auto copy = node;
  if (sink(copy))
    return {};
  return std::string(buf.begin(), buf.end());
}

std::string certificate_of(const caf::node_id& node) {
  auto s = serialized(node);
  return s.empty() ? s : wire::certificate_of(s);
}

std::string peer_of(const caf::node_id& node) {
  auto s = serialized(node);
  return s.empty() ? s : wire::peer_of(s);
}

const api table = [] {
  api t;
  t.enable_network = &enable_network;
  t.install_tls = &install_tls;
  t.connector = &connector;
  t.open = &open;
  t.tls_failure_for = &tls::failure_for;
  t.init_cluster = &init_cluster;
  t.issue_credentials = &issue_credentials;
  t.revoke_credentials = &revoke_credentials;
  t.load_cluster = &load_cluster;
  t.sign_ticket = &sign_ticket;
  t.check_ticket = &check_ticket;
  t.join_problem = &join_problem;
  t.hmac_sha256 = &hmac_sha256;
  t.digests_equal = &digests_equal;
  t.set_wire_cap = &wire::set_payload_cap;
  t.wire_cap = &wire::payload_cap;
  t.certificate_of = &certificate_of;
  t.wire_refusals = &wire::refusals;
  t.peer_versions = &wire::versions_of;
  t.peer_of = &peer_of;
  t.on_wire_refusal = [](wire::refusal_listener l) { wire::on_refusal(std::move(l)); };
  t.own_certificate = [](const cluster_credentials& c) { return wire::certificate_id_of_file(c.cert); };
  return t;
}();

} // namespace

} // namespace cafhvd::net

extern "C" __attribute__((visibility("default"))) const cafhvd::net::api* cafhvd_net_api() {
  return &cafhvd::net::table;
}
