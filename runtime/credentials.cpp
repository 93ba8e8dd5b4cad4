// Credentials with OpenSSL's C API: EC P-256 keys, X.509 certificates, checks.
#include "runtime/credentials.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <openssl/err.h>
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

std::string ssl_error() {
  auto code = ERR_get_error();
  if (code == 0)
    return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

pkey_ptr new_key() {
  pkey_ptr key{EVP_EC_gen("P-256")};
  if (!key)
    throw credentials_error("cannot generate a key: " + ssl_error());
  return key;
}

x509_ptr new_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                  bool ca) {
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
    add(NID_ext_key_usage, "serverAuth,clientAuth");
  if (!X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()))
    throw credentials_error("cannot sign a certificate: " + ssl_error());
  return cert;
}

void write_file(const std::string& path, mode_t mode, bool key, void* obj) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0)
    throw credentials_error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  FILE* f = ::fdopen(fd, "w");
  bool ok = key ? PEM_write_PrivateKey(f, static_cast<EVP_PKEY*>(obj), nullptr, nullptr, 0, nullptr,
                                       nullptr)
                : PEM_write_X509(f, static_cast<X509*>(obj));
  ok = (std::fclose(f) == 0) && ok;
  if (!ok)
    throw credentials_error(fmt::format("cannot write {}", path));
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

cluster_credentials paths(const std::string& dir) {
  return {dir, dir + "/ca.pem", dir + "/member.pem", dir + "/member.key"};
}

} // namespace

std::string cluster_dir(const std::optional<std::string>& flag) {
  if (flag && !flag->empty())
    return *flag;
  if (const char* env = std::getenv("CAF_HVD_CLUSTER_DIR"); env && *env)
    return env;
  const char* home = std::getenv("HOME");
  return fmt::format("{}/.config/caf-hvd/cluster", home && *home ? home : ".");
}

cluster_credentials init_cluster(const std::string& dir) {
  auto p = paths(dir);
  for (auto& f : {p.ca_cert, p.member_cert, p.member_key, dir + "/ca.key"})
    if (::access(f.c_str(), F_OK) == 0)
      throw credentials_error(fmt::format(
          "{} already exists; refusing to overwrite a cluster's credentials (remove the "
          "directory to start a new cluster)",
          f));
  // mkdir -p with 0700 for the last component.
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (::mkdir(partial.c_str(), i == dir.size() ? 0700 : 0755) != 0 && errno != EEXIST)
        throw credentials_error(fmt::format("cannot create {}: {}", partial, std::strerror(errno)));
    }
  }
  ::chmod(dir.c_str(), 0700);
  auto ca_key = new_key();
  auto ca = new_cert(ca_key.get(), "caf-hvd cluster CA", nullptr, nullptr, true);
  auto member_key = new_key();
  auto member = new_cert(member_key.get(), "caf-hvd member", ca.get(), ca_key.get(), false);
  write_file(dir + "/ca.key", 0600, true, ca_key.get());
  write_file(p.ca_cert, 0644, false, ca.get());
  write_file(p.member_key, 0600, true, member_key.get());
  write_file(p.member_cert, 0644, false, member.get());
  return p;
}

cluster_credentials load_cluster(const std::string& dir) {
  auto p = paths(dir);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw credentials_error(fmt::format(
        "no cluster credentials in {} ({}); create them with 'caf-hvd cluster init {}' and copy "
        "the directory to every host, or pass --insecure on trusted networks",
        dir, std::strerror(errno), dir));
  auto ca = read_cert(p.ca_cert);
  auto member = read_cert(p.member_cert);
  if (::stat(p.member_key.c_str(), &st) != 0)
    throw credentials_error(fmt::format("cannot read {}: {}", p.member_key, std::strerror(errno)));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw credentials_error(
        fmt::format("{} is accessible by other users (mode {:o}); run 'chmod 600 {}'", p.member_key,
                    st.st_mode & 0777, p.member_key));
  FILE* f = std::fopen(p.member_key.c_str(), "r");
  if (!f)
    throw credentials_error(fmt::format("cannot read {}: {}", p.member_key, std::strerror(errno)));
  pkey_ptr key{PEM_read_PrivateKey(f, nullptr, nullptr, nullptr)};
  std::fclose(f);
  if (!key)
    throw credentials_error(fmt::format("{} is not an unencrypted PEM private key", p.member_key));
  if (X509_check_private_key(member.get(), key.get()) != 1)
    throw credentials_error(fmt::format("{} does not belong to {}", p.member_key, p.member_cert));
  pkey_ptr ca_pub{X509_get_pubkey(ca.get())};
  if (X509_verify(member.get(), ca_pub.get()) != 1)
    throw credentials_error(
        fmt::format("{} is not signed by the cluster CA {}", p.member_cert, p.ca_cert));
  for (auto* c : {ca.get(), member.get()})
    if (X509_cmp_current_time(X509_get0_notAfter(c)) <= 0
        || X509_cmp_current_time(X509_get0_notBefore(c)) >= 0)
      throw credentials_error(fmt::format("a certificate in {} is expired or not yet valid", dir));
  return p;
}

} // namespace cafhvd
