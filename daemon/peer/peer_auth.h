// How daemons prove to each other that they belong to the cluster, on the peer service:
//   - a cluster token (--peer-token-file, the same file on every node): it never travels;
//     every call carries a proof made with it (token_proof.h), which the service checks.
//   - mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca): the service requires a
//     client certificate the cluster's CA signed, and clients verify the service's.
// Either or both. With neither, the peer service listens on loopback only and multi-node jobs
// are refused, saying how to configure one (see config.cc and registry.cc).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "daemon/peer/peer_channels.h"
#include "shared/status.h"

namespace gradsync {

struct PeerAuth {
  std::string token;                      // empty: no token
  std::string tls_cert, tls_key, tls_ca;  // PEM text; all empty: no TLS
  // This daemon, to the peers' stores (key_scope.h). A random secret made by load(); each call
  // about a job carries instance_for(rendezvous, job) under kInstanceKey, so what one
  // rendezvous learns names this daemon for that job there and nowhere else.
  std::string instance_secret;
  std::string instance_for(const std::string& rendezvous, const std::string& job) const;
  // This daemon's name to its peers (its advertised peer address), which every proof carries:
  // the member the peer stores' quotas count (kv_store.h). Empty in tools and tests that do
  // not name one.
  std::string node;
  // The daemon's channels to its peers, one per address, which every PeerClient made with this
  // auth shares (peer_channels.h says why). Null in tools and tests: each client makes its own.
  std::shared_ptr<PeerChannels> channels;

  bool tls() const { return !tls_ca.empty(); }
  bool configured() const { return !token.empty() || tls(); }

  // Reads the files named by the flags; errors name the flag and the file. A token file must
  // hold at least 16 bytes (after trailing whitespace is dropped) and be readable by nobody
  // but its owner.
  static Status load(const std::string& token_file, const std::string& cert_file, const std::string& key_file,
                     const std::string& ca_file, PeerAuth* out);

  std::shared_ptr<grpc::ChannelCredentials> channel_credentials() const;
  std::shared_ptr<grpc::ServerCredentials> server_credentials() const;

  static constexpr char kInstanceKey[] = "gradsync-peer-instance";
  // 32 random bytes, for instance_secret.
  static std::string make_secret();
};

}  // namespace gradsync
