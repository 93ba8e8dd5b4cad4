// Cluster credentials with OpenSSL (part of caf-hvd-net.so; the binary calls them through
// runtime/network/net.hpp): creating a cluster's CA and certificates, revoking them, loading and
// checking one process's set.
#pragma once

#include <string>
#include <vector>

#include "runtime/cluster/credential_files.hpp"

struct x509_st; // OpenSSL's X509

namespace cafhvd {

/// The role a certificate's extended key usage gives it.
cert_role role_of(x509_st* cert);

/// Whether a node certificate may also connect (to join a cluster): node certificates
/// issued before membership existed serve only.
bool can_join(x509_st* cert);

/// The certificate's common name (the name it was issued under).
std::string common_name_of(x509_st* cert);

/// Signs `body` with the key of `creds` (its certificate goes along). Throws
/// credentials_error.
signed_ticket sign_ticket(const cluster_credentials& creds, const std::string& body);

/// Checks a ticket against the cluster of `creds`: its certificate issued by the CA, valid,
/// not revoked, of `role`; the signature; the body of `purpose` and `audience`, made within
/// five minutes of now. Returns its holder or throws credentials_error saying what failed.
ticket_holder check_ticket(const cluster_credentials& creds, const signed_ticket& t,
                           cert_role role, const std::string& purpose,
                           const std::string& audience);

/// The oldest error in this thread's OpenSSL error queue, as text (and taken off it).
std::string openssl_error();

/// Creates DIR (mode 0700) with a new CA (ca.pem, ca.key), a node certificate (node.pem,
/// node.key, named "node"), a driver certificate (driver.pem, driver.key, named
/// "driver") and an administrator's (admin.pem, admin.key, named "admin"), so one directory serves a single trusted machine as before; hosts of a real
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
