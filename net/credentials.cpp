// Credentials with OpenSSL's C API: EC P-256 keys, X.509 certificates with roles,
// revocation lists, checks.
#include "net/credentials.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ctime>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace cafhvd {

namespace {

template <class T, void (*Free)(T*)> struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;

pkey_ptr new_key() {
  pkey_ptr key{EVP_EC_gen("P-256")};
  if (!key)
    throw credentials_error("cannot generate a key: " + openssl_error());
  return key;
}

x509_ptr new_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool ca,
                  cert_role role = cert_role::node) {
  x509_ptr cert{X509_new()};
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof(serial));
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 60L * 60 * 24 * 3650);
  X509_set_pubkey(cert.get(), key);
  auto name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("caf-hvd cluster"), -1, -1, 0);
  if (!ca)
    X509_NAME_add_entry_by_txt(name, "OU", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(to_string(role)), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer : cert.get(), cert.get(), nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    auto ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  };
  add(NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  add(NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  if (!ca)
    // A node agent serves drivers and, to join its cluster, connects to another agent:
    // both usages, with the role in OU (what tells it from a pre-role member
    // certificate). A driver only connects.
    add(NID_ext_key_usage, role == cert_role::node ? "critical,serverAuth,clientAuth"
                           : role == cert_role::driver || role == cert_role::admin
                               ? "critical,clientAuth"
                               : "serverAuth,clientAuth");
  if (!X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()))
    throw credentials_error("cannot sign a certificate: " + openssl_error());
  return cert;
}

// Creates (or replaces, when `replace`) a file with `mode` and writes `body` into it.
void write_with(const std::string& path, mode_t mode, bool replace,
                const std::function<bool(FILE*)>& body) {
  auto target = replace ? path + ".new" : path;
  int fd =
      ::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (replace ? O_TRUNC : O_EXCL), mode);
  if (fd < 0)
    throw credentials_error(fmt::format("cannot create {}: {}", target, std::strerror(errno)));
  FILE* f = ::fdopen(fd, "w");
  bool ok = body(f);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok)
    throw credentials_error(fmt::format("cannot write {}", target));
  if (replace && ::rename(target.c_str(), path.c_str()) != 0)
    throw credentials_error(fmt::format("cannot replace {}: {}", path, std::strerror(errno)));
}

void write_file(const std::string& path, mode_t mode, bool key, void* obj) {
  write_with(path, mode, false, [&](FILE* f) {
    return key ? PEM_write_PrivateKey(f, static_cast<EVP_PKEY*>(obj), nullptr, nullptr, 0, nullptr,
                                      nullptr)
                     == 1
               : PEM_write_X509(f, static_cast<X509*>(obj)) == 1;
  });
}

x509_ptr read_cert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    throw credentials_error(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  x509_ptr cert{PEM_read_X509(f, nullptr, nullptr, nullptr)};
  std::fclose(f);
  if (!cert)
    throw credentials_error(fmt::format("{} is not a PEM certificate", path));
  return cert;
}

// A private key file: present, not readable by others, unencrypted PEM.
pkey_ptr read_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw credentials_error(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw credentials_error(fmt::format("{} is accessible by other users (mode {:o}); run 'chmod "
                                        "600 {}'",
                                        path, st.st_mode & 0777, path));
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    throw credentials_error(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  pkey_ptr key{PEM_read_PrivateKey(f, nullptr, nullptr, nullptr)};
  std::fclose(f);
  if (!key)
    throw credentials_error(fmt::format("{} is not an unencrypted PEM private key", path));
  return key;
}

bool exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

// mkdir -p with 0700 for the last component.
void make_private_dir(const std::string& dir) {
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      auto partial = dir.substr(0, i);
      if (::mkdir(partial.c_str(), i == dir.size() ? 0700 : 0755) != 0 && errno != EEXIST)
        throw credentials_error(fmt::format("cannot create {}: {}", partial, std::strerror(errno)));
    }
  }
  ::chmod(dir.c_str(), 0700);
}

std::string serial_hex(X509* cert) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr);
  char* hex = BN_bn2hex(bn);
  std::string out = hex;
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

std::string role_file(cert_role r) {
  return r == cert_role::driver ? "driver" : r == cert_role::admin ? "admin" : "node";
}

void check_name(const std::string& name) {
  if (name.empty() || name.size() > 64
      || std::any_of(name.begin(), name.end(), [](unsigned char c) {
           return !(std::isalnum(c) || c == '-' || c == '_' || c == '.');
         }))
    throw credentials_error(
        fmt::format("'{}' is not a member name: use 1-64 letters, digits, '-', '_' or '.'", name));
}

struct ca_material {
  x509_ptr cert;
  pkey_ptr key;
};

ca_material read_ca(const std::string& dir) {
  auto key_path = dir + "/ca.key";
  if (!exists(key_path))
    throw credentials_error(fmt::format(
        "{} has no ca.key: certificates are issued and revoked where the cluster was made "
        "('caf-hvd cluster init'), not on a host that only received its credentials",
        dir));
  ca_material ca{read_cert(dir + "/ca.pem"), read_key(key_path)};
  if (X509_check_private_key(ca.cert.get(), ca.key.get()) != 1)
    throw credentials_error(fmt::format("{}/ca.key does not belong to {}/ca.pem", dir, dir));
  return ca;
}

struct issued_entry {
  std::string serial;
  std::string role;
  std::string name;
};

std::vector<issued_entry> read_index(const std::string& path) {
  std::vector<issued_entry> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    issued_entry e;
    if (std::getline(fields, e.serial, '\t') && std::getline(fields, e.role, '\t')
        && std::getline(fields, e.name, '\t'))
      out.push_back(std::move(e));
  }
  return out;
}

void append_line(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0)
    throw credentials_error(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  auto text = line + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok)
    throw credentials_error(fmt::format("cannot write {}", path));
}

// Writes a member's key and certificate into `out` as `<role>.key` and `<role>.pem`.
void issue_into(const ca_material& ca, const std::string& index, cert_role role,
                const std::string& name, const std::string& out) {
  auto key = new_key();
  auto cert = new_cert(key.get(), name, ca.cert.get(), ca.key.get(), false, role);
  write_file(out + "/" + role_file(role) + ".key", 0600, true, key.get());
  write_file(out + "/" + role_file(role) + ".pem", 0644, false, cert.get());
  append_line(index, fmt::format("{}\t{}\t{}", serial_hex(cert.get()), to_string(role), name));
}

void copy_file(const std::string& from, const std::string& to, mode_t mode) {
  std::ifstream in(from, std::ios::binary);
  if (!in)
    throw credentials_error(fmt::format("cannot read {}: {}", from, std::strerror(errno)));
  std::string body{std::istreambuf_iterator<char>(in), {}};
  write_with(to, mode, true,
             [&](FILE* f) { return std::fwrite(body.data(), 1, body.size(), f) == body.size(); });
}

} // namespace

void init_cluster(const std::string& dir) {
  for (auto f : {"ca.pem", "ca.key", "node.pem", "node.key", "driver.pem", "driver.key",
                 "member.pem", "member.key"})
    if (exists(dir + "/" + f))
      throw credentials_error(fmt::format(
          "{}/{} already exists; refusing to overwrite a cluster's credentials (remove the "
          "directory to start a new cluster)",
          dir, f));
  make_private_dir(dir);
  auto ca_key = new_key();
  auto ca = new_cert(ca_key.get(), "caf-hvd cluster CA", nullptr, nullptr, true);
  write_file(dir + "/ca.key", 0600, true, ca_key.get());
  write_file(dir + "/ca.pem", 0644, false, ca.get());
  ca_material m{std::move(ca), std::move(ca_key)};
  issue_into(m, dir + "/issued.tsv", cert_role::node, "node", dir);
  issue_into(m, dir + "/issued.tsv", cert_role::driver, "driver", dir);
  issue_into(m, dir + "/issued.tsv", cert_role::admin, "admin", dir);
}

std::string issue_credentials(const std::string& dir, cert_role role, const std::string& name,
                              const std::string& out) {
  if (role == cert_role::member)
    throw credentials_error("member certificates are no longer issued; issue a node or a "
                            "driver certificate");
  check_name(name);
  auto ca = read_ca(dir);
  auto revoked = read_index(dir + "/revoked.tsv");
  for (auto& e : read_index(dir + "/issued.tsv"))
    if (e.name == name && e.role == to_string(role)
        && std::none_of(revoked.begin(), revoked.end(),
                        [&](auto& r) { return r.serial == e.serial; }))
      throw credentials_error(
          fmt::format("a {} certificate named '{}' was already issued (serial {}); revoke it first "
                      "('caf-hvd cluster revoke {}') or choose another name",
                      to_string(role), name, e.serial, name));
  auto target = out.empty() ? dir + "/issued/" + name : out;
  for (auto f : {"ca.pem", "node.pem", "node.key", "driver.pem", "driver.key", "admin.pem",
                 "admin.key"})
    if (exists(target + "/" + f))
      throw credentials_error(
          fmt::format("{}/{} already exists; refusing to overwrite credentials", target, f));
  make_private_dir(target);
  issue_into(ca, dir + "/issued.tsv", role, name, target);
  copy_file(dir + "/ca.pem", target + "/ca.pem", 0644);
  if (exists(dir + "/crl.pem"))
    copy_file(dir + "/crl.pem", target + "/crl.pem", 0644);
  return target;
}

std::vector<std::string> revoke_credentials(const std::string& dir, const std::string& name) {
  auto ca = read_ca(dir);
  auto issued = read_index(dir + "/issued.tsv");
  if (name.find('/') != std::string::npos || name.ends_with(".pem")) {
    // A certificate file: what clusters made before roles have (no index knows them).
    auto cert = read_cert(name);
    pkey_ptr ca_pub{X509_get_pubkey(ca.cert.get())};
    if (X509_verify(cert.get(), ca_pub.get()) != 1)
      throw credentials_error(fmt::format("{} is not signed by this cluster's CA", name));
    issued.push_back({serial_hex(cert.get()), to_string(role_of(cert.get())), name});
  } else {
    check_name(name);
  }
  auto revoked = read_index(dir + "/revoked.tsv");
  std::vector<std::string> now_revoked;
  for (auto& e : issued)
    if (e.name == name && std::none_of(revoked.begin(), revoked.end(), [&](auto& r) {
          return r.serial == e.serial;
        })) {
      now_revoked.push_back(e.serial);
      append_line(dir + "/revoked.tsv", fmt::format("{}\t{}\t{}", e.serial, e.role, e.name));
      revoked.push_back(e);
    }
  if (now_revoked.empty()) {
    bool known = std::any_of(issued.begin(), issued.end(), [&](auto& e) { return e.name == name; });
    throw credentials_error(
        known ? fmt::format("every certificate named '{}' is already revoked", name)
              : fmt::format("this cluster issued no certificate named '{}' (see {}/issued.tsv)",
                            name, dir));
  }
  // The list holds every revoked serial; it is valid for ten years (OpenSSL refuses a
  // list past its next update, which would lock every member out).
  std::unique_ptr<X509_CRL, deleter<X509_CRL, X509_CRL_free>> crl{X509_CRL_new()};
  X509_CRL_set_version(crl.get(), 1);
  X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca.cert.get()));
  std::unique_ptr<ASN1_TIME, deleter<ASN1_TIME, ASN1_TIME_free>> now{X509_gmtime_adj(nullptr, -60)},
      next{X509_gmtime_adj(nullptr, 60L * 60 * 24 * 3650)};
  X509_CRL_set1_lastUpdate(crl.get(), now.get());
  X509_CRL_set1_nextUpdate(crl.get(), next.get());
  for (auto& r : revoked) {
    BIGNUM* bn = nullptr;
    if (BN_hex2bn(&bn, r.serial.c_str()) == 0)
      throw credentials_error(fmt::format("{}/revoked.tsv: bad serial '{}'", dir, r.serial));
    X509_REVOKED* rev = X509_REVOKED_new();
    ASN1_INTEGER* serial = BN_to_ASN1_INTEGER(bn, nullptr);
    X509_REVOKED_set_serialNumber(rev, serial);
    X509_REVOKED_set_revocationDate(rev, now.get());
    X509_CRL_add0_revoked(crl.get(), rev);
    ASN1_INTEGER_free(serial);
    BN_free(bn);
  }
  X509_CRL_sort(crl.get());
  if (!X509_CRL_sign(crl.get(), ca.key.get(), EVP_sha256()))
    throw credentials_error("cannot sign the revocation list: " + openssl_error());
  write_with(dir + "/crl.pem", 0644, true,
             [&](FILE* f) { return PEM_write_X509_CRL(f, crl.get()) == 1; });
  // Member directories issued from here get the new list too.
  if (auto* d = ::opendir((dir + "/issued").c_str())) {
    while (auto* ent = ::readdir(d)) {
      std::string sub = dir + "/issued/" + ent->d_name;
      if (ent->d_name[0] != '.' && exists(sub + "/ca.pem"))
        copy_file(dir + "/crl.pem", sub + "/crl.pem", 0644);
    }
    ::closedir(d);
  }
  return now_revoked;
}

cluster_credentials load_cluster(const std::string& dir, cert_role role) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw credentials_error(fmt::format(
        "no cluster credentials in {} ({}); make a cluster with 'caf-hvd cluster init DIR' "
        "where its CA is kept and give each host only the directory 'caf-hvd cluster "
        "add-node NAME' (or add-driver) issues for it, or pass --insecure on trusted networks",
        dir, std::strerror(errno)));
  cluster_credentials c;
  c.dir = dir;
  c.ca_cert = dir + "/ca.pem";
  c.role = role;
  auto base = role_file(role);
  c.cert = dir + "/" + base + ".pem";
  c.key = dir + "/" + base + ".key";
  if (!exists(c.cert) && exists(dir + "/member.pem")) {
    c.cert = dir + "/member.pem";
    c.key = dir + "/member.key";
    c.role = cert_role::member;
  } else if (!exists(c.cert)) {
    throw credentials_error(fmt::format(
        "{} holds no {} certificate ({}.pem); a {} needs one: issue it where the cluster was "
        "made with 'caf-hvd cluster add-{} NAME' and copy the directory it names here",
        dir, base, base,
        role == cert_role::driver  ? "driver"
        : role == cert_role::admin ? "cluster administrator"
                                   : "node agent",
        base));
  }
  auto ca = read_cert(c.ca_cert);
  auto cert = read_cert(c.cert);
  auto key = read_key(c.key);
  if (X509_check_private_key(cert.get(), key.get()) != 1)
    throw credentials_error(fmt::format("{} does not belong to {}", c.key, c.cert));
  pkey_ptr ca_pub{X509_get_pubkey(ca.get())};
  if (X509_verify(cert.get(), ca_pub.get()) != 1)
    throw credentials_error(
        fmt::format("{} is not signed by the cluster CA {}", c.cert, c.ca_cert));
  for (auto* x : {ca.get(), cert.get()})
    if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0
        || X509_cmp_current_time(X509_get0_notBefore(x)) >= 0)
      throw credentials_error(fmt::format("a certificate in {} is expired or not yet valid", dir));
  if (auto found = role_of(cert.get()); found != c.role)
    throw credentials_error(fmt::format("{} is a {} certificate, not a {} certificate", c.cert,
                                        to_string(found), to_string(c.role)));
  if (exists(dir + "/crl.pem")) {
    c.crl = dir + "/crl.pem";
    FILE* f = std::fopen(c.crl.c_str(), "r");
    if (!f)
      throw credentials_error(fmt::format("cannot read {}: {}", c.crl, std::strerror(errno)));
    std::unique_ptr<X509_CRL, deleter<X509_CRL, X509_CRL_free>> crl{
        PEM_read_X509_CRL(f, nullptr, nullptr, nullptr)};
    std::fclose(f);
    if (!crl)
      throw credentials_error(fmt::format("{} is not a PEM revocation list", c.crl));
    if (X509_CRL_verify(crl.get(), ca_pub.get()) != 1)
      throw credentials_error(
          fmt::format("{} is not signed by the cluster CA {}", c.crl, c.ca_cert));
    X509_REVOKED* rev = nullptr;
    if (X509_CRL_get0_by_cert(crl.get(), &rev, cert.get()) == 1)
      throw credentials_error(
          fmt::format("{} is revoked by {}; ask the cluster's administrator for a new certificate",
                      c.cert, c.crl));
  }
  return c;
}

cert_role role_of(x509_st* cert) {
  uint32_t xku = X509_get_extended_key_usage(cert);
  bool server = xku & XKU_SSL_SERVER;
  bool client = xku & XKU_SSL_CLIENT;
  if (server && !client)
    return cert_role::node;
  char ou_text[32] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_organizationalUnitName, ou_text,
                            sizeof(ou_text));
  if (client && !server)
    return std::string_view{ou_text} == "admin" ? cert_role::admin : cert_role::driver;
  if (client && server) {
    // A node certificate that may join a cluster names its role; a pre-role member
    // certificate has no OU.
    char ou[32] = "";
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_organizationalUnitName, ou,
                              sizeof(ou));
    if (std::string_view{ou} == "node")
      return cert_role::node;
  }
  return cert_role::member;
}

bool can_join(x509_st* cert) {
  return role_of(cert) == cert_role::node && (X509_get_extended_key_usage(cert) & XKU_SSL_CLIENT);
}

std::string common_name_of(x509_st* cert) {
  char buf[256] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, sizeof(buf));
  return buf;
}

std::string openssl_error() {
  auto code = ERR_get_error();
  if (code == 0)
    return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}


signed_ticket sign_ticket(const cluster_credentials& creds, const std::string& body) {
  auto key = read_key(creds.key);
  std::ifstream in{creds.cert};
  std::stringstream pem;
  pem << in.rdbuf();
  if (!in)
    throw credentials_error(fmt::format("cannot read {}", creds.cert));
  std::unique_ptr<EVP_MD_CTX, deleter<EVP_MD_CTX, EVP_MD_CTX_free>> md{EVP_MD_CTX_new()};
  size_t len = 0;
  if (EVP_DigestSignInit(md.get(), nullptr, EVP_sha256(), nullptr, key.get()) != 1
      || EVP_DigestSign(md.get(), nullptr, &len,
                        reinterpret_cast<const unsigned char*>(body.data()), body.size())
             != 1)
    throw credentials_error("cannot sign a ticket: " + openssl_error());
  std::string sig(len, '\0');
  if (EVP_DigestSign(md.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(body.data()), body.size())
      != 1)
    throw credentials_error("cannot sign a ticket: " + openssl_error());
  sig.resize(len);
  return {pem.str(), body, sig};
}

ticket_holder check_ticket(const cluster_credentials& creds, const signed_ticket& t,
                           cert_role role, const std::string& purpose,
                           const std::string& audience) {
  if (t.cert.size() > 16384 || t.body.size() > 4096 || t.signature.size() > 512)
    throw credentials_error("the ticket is too large");
  std::unique_ptr<BIO, deleter<BIO, BIO_free_all>> bio{
      BIO_new_mem_buf(t.cert.data(), static_cast<int>(t.cert.size()))};
  x509_ptr cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)};
  if (!cert)
    throw credentials_error("the ticket carries no certificate");
  // The chain, validity and revocation, as a TLS handshake would check them.
  std::unique_ptr<X509_STORE, deleter<X509_STORE, X509_STORE_free>> store{X509_STORE_new()};
  auto ca = read_cert(creds.ca_cert);
  X509_STORE_add_cert(store.get(), ca.get());
  // The directory's list as it is now (read for every ticket: a crl.pem that appeared or
  // changed since the process started counts at once; OpenSSL checks its signature).
  auto crl_path = !creds.crl.empty()                   ? creds.crl
                  : exists(creds.dir + "/crl.pem") ? creds.dir + "/crl.pem"
                                                       : std::string{};
  if (!crl_path.empty()) {
    FILE* f = std::fopen(crl_path.c_str(), "r");
    if (!f)
      throw credentials_error(fmt::format("cannot read {}: {}", crl_path, std::strerror(errno)));
    while (X509_CRL* crl = PEM_read_X509_CRL(f, nullptr, nullptr, nullptr)) {
      X509_STORE_add_crl(store.get(), crl);
      X509_CRL_free(crl);
    }
    std::fclose(f);
    ERR_clear_error();
    X509_STORE_set_flags(store.get(), X509_V_FLAG_CRL_CHECK);
  }
  std::unique_ptr<X509_STORE_CTX, deleter<X509_STORE_CTX, X509_STORE_CTX_free>> vctx{
      X509_STORE_CTX_new()};
  X509_STORE_CTX_init(vctx.get(), store.get(), cert.get(), nullptr);
  if (X509_verify_cert(vctx.get()) != 1)
    throw credentials_error(
        fmt::format("its certificate '{}' is not valid in this cluster: {}",
                    common_name_of(cert.get()),
                    X509_verify_cert_error_string(X509_STORE_CTX_get_error(vctx.get()))));
  auto found = role_of(cert.get());
  if (found != role && found != cert_role::member)
    throw credentials_error(fmt::format("its certificate '{}' is a {} certificate, not a {} one",
                                        common_name_of(cert.get()), to_string(found),
                                        to_string(role)));
  pkey_ptr pub{X509_get_pubkey(cert.get())};
  std::unique_ptr<EVP_MD_CTX, deleter<EVP_MD_CTX, EVP_MD_CTX_free>> md{EVP_MD_CTX_new()};
  if (!pub || EVP_DigestVerifyInit(md.get(), nullptr, EVP_sha256(), nullptr, pub.get()) != 1
      || EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(t.signature.data()),
                          t.signature.size(),
                          reinterpret_cast<const unsigned char*>(t.body.data()), t.body.size())
             != 1) {
    ERR_clear_error();
    throw credentials_error(
        fmt::format("the ticket's signature is not by '{}'", common_name_of(cert.get())));
  }
  // caf-hvd ticket 1 / purpose / audience / subject / time
  std::vector<std::string> lines;
  std::stringstream body{t.body};
  for (std::string line; std::getline(body, line);)
    lines.push_back(line);
  if (lines.size() != 5 || lines[0] != "caf-hvd ticket 1")
    throw credentials_error("the ticket is not a caf-hvd ticket");
  if (lines[1] != purpose || lines[2] != audience)
    throw credentials_error(fmt::format("the ticket is for {} at '{}', not for {} at '{}'",
                                        lines[1], lines[2], purpose, audience));
  char* end = nullptr;
  long made = std::strtol(lines[4].c_str(), &end, 10);
  long now = static_cast<long>(::time(nullptr));
  if (!end || *end || made < now - 300 || made > now + 300)
    throw credentials_error(
        fmt::format("the ticket was made at {} (now {}): more than five minutes apart; are the "
                    "clocks of the two hosts set?",
                    lines[4], now));
  ticket_holder h;
  h.name = common_name_of(cert.get());
  h.role = found == cert_role::member ? role : found;
  h.subject = lines[3];
  h.shared = h.name == "node" || h.name == "driver" || h.name == "admin"
             || found == cert_role::member;
  return h;
}

} // namespace cafhvd
