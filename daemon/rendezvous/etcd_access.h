// What this daemon may use of etcd, loaded once at start from its settings (etcd_settings.h):
// the members it may send credentials to, its TLS material and password (read now, so that a
// missing file is the daemon's start-up error, not every job's), and its gRPC channels to the
// members, one per member for the daemon's life (peer_channels.h says why).
//
// A trainer names its job's rendezvous, and so which etcd members the daemon calls; the
// allowlist is what keeps the daemon's credentials from going to a member a trainer chose.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon/peer/peer_channels.h"
#include "daemon/rendezvous/etcd_settings.h"
#include "daemon/rendezvous/etcd_tokens.h"
#include "shared/status.h"

namespace gradsync {

// The scheme of a rendezvous through etcd: "etcd://HOST:PORT[,HOST:PORT...]".
inline constexpr char kEtcdScheme[] = "etcd://";
bool is_etcd_rendezvous(const std::string& rendezvous);

class EtcdAccess {
 public:
  // The settings' own consistency, without reading their files (config parsing): the error
  // names the flag. *endpoints (optional) gets the members, normalized.
  static Status check(const EtcdSettings& settings, std::vector<std::string>* endpoints = nullptr);
  // Errors name the flag: a member that is not HOST:PORT, credentials without --etcd-endpoints
  // (they would go wherever a trainer says), a certificate without its key or the CA, a file
  // that cannot be read, a password file others can read. `counter_ttl`: how long a job's
  // counters outlive their last use (--peer-key-ttl-s, as for the peer store's keys).
  static Status load(const EtcdSettings& settings, std::chrono::seconds counter_ttl,
                     std::shared_ptr<const EtcdAccess>* out);

  // The members a job's rendezvous names, checked: "etcd://" alone means the configured ones;
  // each member named must be one of them when members are configured.
  Status members(const std::string& rendezvous, std::vector<std::string>* out) const;

  // The shared channel to `member`.
  std::shared_ptr<grpc::Channel> channel(const std::string& member) const;
  // The daemon's tokens, by member (etcd_tokens.h).
  EtcdTokens& tokens() const { return *tokens_; }

  // The most members one rendezvous may name: each is a channel and a turn in every failover.
  static constexpr size_t kMaxMembers = 16;
  // The largest reply taken from a member. etcd's largest to us is a read of 64 keys
  // (etcd_store.cc), each at most its --max-request-bytes (1.5 MiB by default): 96 MiB; a
  // watch's replies are fragmented at that size.
  static constexpr size_t kMaxReply = 128u << 20;

  bool tls() const { return tls_; }
  const std::string& user() const { return user_; }
  const std::string& password() const { return password_; }
  std::chrono::seconds lease_ttl() const { return lease_ttl_; }
  std::chrono::seconds counter_ttl() const { return counter_ttl_; }
  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> endpoints_;
  bool tls_ = false;  // --etcd-tls-ca given (and its file a certificate)
  std::string tls_ca_, tls_cert_, tls_key_;
  std::string user_, password_;
  std::chrono::seconds lease_ttl_{10};
  std::chrono::seconds counter_ttl_{24 * 3600};
  std::string prefix_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::shared_ptr<PeerChannels> channels_;
  std::shared_ptr<EtcdTokens> tokens_;
};

}  // namespace gradsync
