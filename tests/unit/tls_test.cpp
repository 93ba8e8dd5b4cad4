// Cluster credentials with roles and revocation, and the shared TLS context's handshake
// checks, over in-memory BIO pairs (no sockets).
#include <doctest/doctest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/stat.h>

#include <openssl/ssl.h>

#include "net/credentials.hpp"
#include "net/tls_context.hpp"

using namespace cafhvd;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    char tmpl[] = "/tmp/caf-hvd-tls-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { fs::remove_all(path); }
  std::string operator/(const std::string& sub) const { return (path / sub).string(); }
};

struct handshake_result {
  bool ok;
  std::string server_refusal;
  std::string client_refusal;
};

// Runs a full handshake between a server and a client context through a BIO pair.
handshake_result handshake(SSL_CTX* server_ctx, SSL_CTX* client_ctx) {
  SSL* server = SSL_new(server_ctx);
  SSL* client = SSL_new(client_ctx);
  BIO* a = nullptr;
  BIO* b = nullptr;
  BIO_new_bio_pair(&a, 0, &b, 0);
  SSL_set_bio(server, a, a);
  SSL_set_bio(client, b, b);
  SSL_set_accept_state(server);
  SSL_set_connect_state(client);
  int rs = 0;
  int rc = 0;
  for (int i = 0; i < 20 && (rs != 1 || rc != 1); ++i) {
    rc = SSL_do_handshake(client);
    rs = SSL_do_handshake(server);
  }
  // TLS 1.3: the server judges the client's certificate after the client finished; a
  // refusal reaches the client with its first read.
  bool ok = rs == 1 && rc == 1;
  if (ok) {
    char byte = 'x';
    SSL_write(server, &byte, 1);
    ok = SSL_read(client, &byte, 1) == 1;
  }
  handshake_result r{ok, tls::refusal(server), tls::refusal(client)};
  SSL_free(server);
  SSL_free(client);
  return r;
}

SSL_CTX* context_for(const std::string& dir, cert_role role) {
  return tls::build_context({load_cluster(dir, role), nullptr});
}

} // namespace

TEST_CASE("cluster init makes a CA, a node and a driver certificate with private keys") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  for (auto f : {"ca.pem", "ca.key", "node.pem", "node.key", "driver.pem", "driver.key"})
    CHECK(fs::exists(dir + "/" + f));
  struct stat st {};
  ::stat((dir + "/driver.key").c_str(), &st);
  CHECK((st.st_mode & 0777) == 0600);
  auto node = load_cluster(dir, cert_role::node);
  CHECK(node.cert == dir + "/node.pem");
  CHECK(node.role == cert_role::node);
  CHECK(node.crl.empty());
  auto driver = load_cluster(dir, cert_role::driver);
  CHECK(driver.key == dir + "/driver.key");
  CHECK_THROWS_WITH_AS(init_cluster(dir), doctest::Contains("refusing to overwrite"),
                       credentials_error);
}

TEST_CASE("an issued directory holds one role's credentials and no CA key") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  auto out = issue_credentials(dir, cert_role::node, "h1", "");
  CHECK(out == dir + "/issued/h1");
  CHECK(fs::exists(out + "/node.pem"));
  CHECK(fs::exists(out + "/ca.pem"));
  CHECK_FALSE(fs::exists(out + "/ca.key"));
  CHECK_FALSE(fs::exists(out + "/driver.key"));
  CHECK(load_cluster(out, cert_role::node).role == cert_role::node);
  CHECK_THROWS_WITH_AS(load_cluster(out, cert_role::driver),
                       doctest::Contains("holds no driver certificate"), credentials_error);
  CHECK_THROWS_WITH_AS(issue_credentials(dir, cert_role::node, "h1", t / "again"),
                       doctest::Contains("already issued"), credentials_error);
  CHECK_THROWS_WITH_AS(issue_credentials(out, cert_role::node, "h2", t / "x"),
                       doctest::Contains("has no ca.key"), credentials_error);
  CHECK_THROWS_WITH_AS(issue_credentials(dir, cert_role::node, "bad/name", t / "y"),
                       doctest::Contains("is not a member name"), credentials_error);
  // A certificate of the other role under this role's file name is refused at load.
  fs::copy_file(dir + "/driver.pem", out + "/node.pem", fs::copy_options::overwrite_existing);
  fs::copy_file(dir + "/driver.key", out + "/node.key", fs::copy_options::overwrite_existing);
  CHECK_THROWS_WITH_AS(load_cluster(out, cert_role::node),
                       doctest::Contains("is a driver certificate, not a node certificate"),
                       credentials_error);
}

TEST_CASE("a driver and a node agent of one cluster complete the handshake") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  auto* node = context_for(dir, cert_role::node);
  auto* driver = context_for(dir, cert_role::driver);
  auto r = handshake(node, driver);
  CHECK(r.ok);
  CHECK(r.server_refusal.empty());
  CHECK(r.client_refusal.empty());
  SSL_CTX_free(node);
  SSL_CTX_free(driver);
}

TEST_CASE("roles: a node certificate connects only as a joining agent, a driver certificate "
          "cannot serve") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  auto h2 = issue_credentials(dir, cert_role::node, "h2", "");
  auto d2 = issue_credentials(dir, cert_role::driver, "d2", "");
  auto* node = context_for(dir, cert_role::node);
  auto* driver = context_for(dir, cert_role::driver);
  // A node agent that joins another connects with its node certificate: TLS admits it;
  // what it may ask for is decided by tickets (a colocator spawn needs a driver's).
  auto* joining = context_for(h2, cert_role::node);
  auto r = handshake(node, joining);
  CHECK(r.ok);
  // A driver's key used to pose as a node agent.
  auto* fake_agent = tls::build_context({[&] {
                                           auto c = load_cluster(d2, cert_role::driver);
                                           c.role = cert_role::node;
                                           return c;
                                         }(),
                                         nullptr});
  r = handshake(fake_agent, driver);
  CHECK_FALSE(r.ok);
  CHECK(r.client_refusal
        == "certificate 'd2' is a driver certificate; a driver connects only to node agents "
           "(node certificates)");
  // ... and to pose as an agent that another agent joins.
  r = handshake(fake_agent, joining);
  CHECK_FALSE(r.ok);
  for (auto* c : {node, driver, joining, fake_agent})
    SSL_CTX_free(c);
}

TEST_CASE("tickets: who signed a statement, checked against the cluster, not the connection") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  auto h2 = issue_credentials(dir, cert_role::node, "h2", "");
  auto d2 = issue_credentials(dir, cert_role::driver, "d2", "");
  auto agent = load_cluster(dir, cert_role::node);
  auto alice = load_cluster(d2, cert_role::driver);
  auto now = static_cast<long>(::time(nullptr));
  auto body = ticket_body("colocator", "NODE-ID#1", "job-7", now);
  auto ticket = sign_ticket(alice, body);
  auto holder = check_ticket(agent, ticket, cert_role::driver, "colocator", "NODE-ID#1");
  CHECK(holder.name == "d2");
  CHECK(holder.role == cert_role::driver);
  CHECK(holder.subject == "job-7");
  CHECK_FALSE(holder.shared);
  // cluster init's own driver certificate is the one every head of a single machine uses
  auto shared = check_ticket(agent, sign_ticket(load_cluster(dir, cert_role::driver), body),
                             cert_role::driver, "colocator", "NODE-ID#1");
  CHECK(shared.shared);
  auto refused = [&](const signed_ticket& tk, cert_role role, const std::string& purpose,
                     const std::string& audience) -> std::string {
    try {
      check_ticket(agent, tk, role, purpose, audience);
    } catch (const credentials_error& e) {
      return e.what();
    }
    return "accepted";
  };
  // a joining agent's node key cannot stand in for a driver's
  auto node_signed = sign_ticket(load_cluster(h2, cert_role::node), body);
  CHECK(refused(node_signed, cert_role::driver, "colocator", "NODE-ID#1")
        == "its certificate 'h2' is a node certificate, not a driver one");
  // a ticket for another agent, or another purpose, is not replayed here
  CHECK(refused(ticket, cert_role::driver, "colocator", "NODE-ID#2")
        == "the ticket is for colocator at 'NODE-ID#1', not for colocator at 'NODE-ID#2'");
  CHECK(refused(ticket, cert_role::driver, "status", "NODE-ID#1").find("not for status")
        != std::string::npos);
  // a changed body breaks the signature
  auto forged = ticket;
  forged.body = ticket_body("colocator", "NODE-ID#1", "job-8", now);
  CHECK(refused(forged, cert_role::driver, "colocator", "NODE-ID#1")
        == "the ticket's signature is not by 'd2'");
  // a certificate of another cluster
  auto other = t / "other";
  init_cluster(other);
  auto stranger = sign_ticket(load_cluster(other, cert_role::driver), body);
  CHECK(refused(stranger, cert_role::driver, "colocator", "NODE-ID#1").find("is not valid in this cluster")
        != std::string::npos);
  // an old ticket
  auto stale = sign_ticket(alice, ticket_body("colocator", "NODE-ID#1", "job-7", now - 3600));
  CHECK(refused(stale, cert_role::driver, "colocator", "NODE-ID#1").find("more than five minutes")
        != std::string::npos);
  // ... or one made for later (a clock far ahead, or a ticket made to be replayed then)
  auto early = sign_ticket(alice, ticket_body("colocator", "NODE-ID#1", "job-7", now + 3600));
  CHECK(refused(early, cert_role::driver, "colocator", "NODE-ID#1").find("more than five minutes")
        != std::string::npos);
  // a body that is not a ticket's, signed all the same
  auto odd = sign_ticket(alice, "colocator\nNODE-ID#1\njob-7\n" + std::to_string(now) + "\n");
  CHECK(refused(odd, cert_role::driver, "colocator", "NODE-ID#1")
        == "the ticket is not a caf-hvd ticket");
  auto extra = sign_ticket(alice, body + "more\n");
  CHECK(refused(extra, cert_role::driver, "colocator", "NODE-ID#1")
        == "the ticket is not a caf-hvd ticket");
  // a revoked driver's tickets stop counting where the new list is, also for an agent
  // that started before the cluster had any list
  revoke_credentials(dir, "d2");
  CHECK(agent.crl.empty());
  CHECK_THROWS_WITH_AS(check_ticket(agent, ticket, cert_role::driver, "colocator", "NODE-ID#1"),
                       doctest::Contains("certificate revoked"), credentials_error);
  // garbage
  CHECK(refused(signed_ticket{"not a certificate", body, "x"}, cert_role::driver, "colocator",
                "NODE-ID#1")
        == "the ticket carries no certificate");
}

TEST_CASE("revocation: a revoked driver is refused, the others are not") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  auto h1 = issue_credentials(dir, cert_role::node, "h1", "");
  auto d1 = issue_credentials(dir, cert_role::driver, "d1", t / "d1");
  auto d2 = issue_credentials(dir, cert_role::driver, "d2", t / "d2");
  auto serials = revoke_credentials(dir, "d1");
  REQUIRE(serials.size() == 1);
  // The list reached the directories issued under DIR, not the ones given with --out.
  CHECK(fs::exists(h1 + "/crl.pem"));
  CHECK_FALSE(fs::exists(d2 + "/crl.pem"));
  auto agent_creds = load_cluster(h1, cert_role::node);
  CHECK(agent_creds.crl == h1 + "/crl.pem");
  auto* agent = tls::build_context({agent_creds, nullptr});
  auto* revoked = context_for(d1, cert_role::driver);
  auto* fine = context_for(d2, cert_role::driver);
  auto r = handshake(agent, revoked);
  CHECK_FALSE(r.ok);
  CHECK(r.server_refusal
        == "certificate 'd1' (serial " + serials[0] + ") is revoked by the cluster's crl.pem");
  CHECK(handshake(agent, fine).ok);
  CHECK_THROWS_WITH_AS(revoke_credentials(dir, "d1"), doctest::Contains("already revoked"),
                       credentials_error);
  CHECK_THROWS_WITH_AS(revoke_credentials(dir, "nobody"),
                       doctest::Contains("issued no certificate named 'nobody'"),
                       credentials_error);
  // A process whose own certificate is revoked is told so at start.
  fs::copy_file(dir + "/crl.pem", d1 + "/crl.pem");
  CHECK_THROWS_WITH_AS(load_cluster(d1, cert_role::driver), doctest::Contains("is revoked"),
                       credentials_error);
  // A name can be issued again once its old certificate is revoked.
  CHECK_NOTHROW(issue_credentials(dir, cert_role::driver, "d1", t / "d1-new"));
  for (auto* c : {agent, revoked, fine})
    SSL_CTX_free(c);
}

TEST_CASE("a revocation list not signed by the cluster's CA is refused") {
  temp_dir t;
  init_cluster(t / "a");
  init_cluster(t / "b");
  issue_credentials(t / "b", cert_role::driver, "x", t / "x");
  revoke_credentials(t / "b", "x");
  fs::copy_file(t / "b/crl.pem", t / "a/crl.pem");
  CHECK_THROWS_WITH_AS(load_cluster(t / "a", cert_role::node),
                       doctest::Contains("crl.pem is not signed by the cluster CA"),
                       credentials_error);
}

TEST_CASE("the shared context is handed out with a reference and replaced by a new install") {
  temp_dir t;
  auto dir = t / "c";
  init_cluster(dir);
  tls::install({load_cluster(dir, cert_role::node), nullptr});
  auto* first = tls::acquire_shared();
  REQUIRE(first != nullptr);
  CHECK(tls::is_ours(first));
  auto d = issue_credentials(dir, cert_role::driver, "late", t / "late");
  auto* late = context_for(d, cert_role::driver);
  CHECK(handshake(first, late).ok);
  revoke_credentials(dir, "late");
  tls::install({load_cluster(dir, cert_role::node), nullptr}); // as an agent's SIGHUP does
  auto* second = tls::acquire_shared();
  CHECK(second != first);
  CHECK_FALSE(handshake(second, late).ok);
  CHECK(handshake(first, late).ok); // a context already handed out keeps its list
  for (auto* c : {first, second, late})
    SSL_CTX_free(c);
}
