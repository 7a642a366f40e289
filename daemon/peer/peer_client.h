// A client of another daemon's peer service, with every call bounded by a deadline and every
// gRPC error translated once, here, into a Status that names the daemon. cancel() ends the
// calls in flight (a blocking get may wait up to a job timeout) and fails every later call, so
// that a failing job or a stopping daemon never waits on a rendezvous.
//
// With a cluster token, each call's proof is bound to the callee's service id (token_proof.h),
// which the client learns by a Ping before its first other call, and again when a call is
// refused (the callee may have restarted): then the call is made once more.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/peer/peer_auth.h"
#include "daemon/peer/rendezvous_store.h"
#include "proto/peer.grpc.pb.h"
#include "shared/status.h"
#include "shared/mutex.h"

namespace gradsync {

// The daemon's shared channel to the peer daemon at `address` (auth->channels, peer_channels.h),
// or one of the caller's own without them (tools, tests).
std::shared_ptr<grpc::Channel> peer_channel(const std::string& address, const std::shared_ptr<const PeerAuth>& auth);

class PeerClient final : public RendezvousStore {
 public:
  // `address` is host:port. Connecting is lazy; the first call reports an unreachable daemon.
  // `auth` is how this daemon proves it belongs to the cluster (null: it does not).
  explicit PeerClient(std::string address, std::shared_ptr<const PeerAuth> auth = nullptr);

  const std::string& address() const { return address_; }

  // The store (rendezvous_store.h) of the daemon at `address`.
  std::string describe() const override { return "the rendezvous daemon at " + address_; }
  Status set(const std::string& job, const std::string& key, const std::string& value,
             std::chrono::milliseconds timeout) override;
  Status set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                       std::chrono::milliseconds timeout, bool* stored) override;
  Status get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
             std::vector<std::string>* values) override;
  Status add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
             int64_t* value) override;
  Status delete_job(const std::string& job, std::chrono::milliseconds timeout, const std::string& prefix) override;
  Status delete_job(const std::string& job, std::chrono::milliseconds timeout) { return delete_job(job, timeout, {}); }
  std::shared_ptr<RendezvousStore> fresh() const override { return std::make_shared<PeerClient>(address_, auth_); }
  // Whether the daemon answers within `timeout`; the second also gives its answer.
  Status ping(std::chrono::milliseconds timeout);
  Status ping(std::chrono::milliseconds timeout, peer::PingReply* reply);
  // Where the daemon's part of `job` (a store job) is.
  Status progress(const std::string& job, std::chrono::milliseconds timeout, peer::ProgressReply* reply);

  void cancel(const Status& why) override;

 private:
  class Call;  // a call in flight, cancellable
  // One call of `method` about `job` (empty: none): proven, made, and made once more when it
  // was refused and the callee's service id has changed since.
  template <class Request, class Reply, class Rpc>
  Status unary(std::string_view method, const std::string& job, std::chrono::milliseconds timeout,
               const Request& request, Reply* reply, Rpc rpc);
  // The callee's service id, from a Ping when not known (or `fresh`); empty without a token.
  Status callee(std::chrono::milliseconds timeout, bool fresh, std::string* id);
  Status put(const std::string& job, const std::string& key, const std::string& value, bool if_absent,
             std::chrono::milliseconds timeout, bool* stored);

  std::string address_;
  std::shared_ptr<const PeerAuth> auth_;
  Mutex mutex_;
  std::set<grpc::ClientContext*> in_flight_ GS_GUARDED_BY(mutex_);
  Status cancelled_ GS_GUARDED_BY(mutex_);
  std::string callee_ GS_GUARDED_BY(mutex_);  // the callee's service id
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<peer::Peer::Stub> stub_;
  // Who this client is to the peer's store (key_scope.h): the daemon's instance secret, or a
  // random one of its own without an auth (tests, tools).
  std::shared_ptr<const PeerAuth> instance_auth_;
};

}  // namespace gradsync
