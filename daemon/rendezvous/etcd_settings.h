// The daemon's etcd settings (--etcd-*), as configured: what a job whose rendezvous is
// "etcd://..." may use. Loaded and checked once at start by EtcdAccess (etcd_access.h).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gradsync {

struct EtcdSettings {
  // The members (HOST:PORT) this daemon may talk to, and to which alone it sends its
  // credentials. A job's "etcd://" without members means these. Empty: a job may name any
  // member, and then no credentials may be configured.
  std::vector<std::string> endpoints;
  // TLS: the CA that signs the members' certificates (TLS on when given), and this daemon's
  // client certificate and key for members that require one (--client-cert-auth).
  std::string tls_ca, tls_cert, tls_key;
  // etcd's own authentication: a user and the file holding its password (mode 0600).
  std::string user, password_file;
  // A node's keys live on a lease of this TTL, kept alive while its job runs: they go this long
  // after its daemon dies.
  std::chrono::seconds lease_ttl{10};
  // Where gradsync's keys live in etcd's key space: <prefix><uid>.<job id>/...
  std::string prefix = "/gradsync/";
};

}  // namespace gradsync
