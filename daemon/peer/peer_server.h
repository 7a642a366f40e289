// The peer service (proto/peer.proto) on a gRPC server of its own: the job-scoped key-value
// store other daemons rendezvous through. The service is a callback-API class, so a waiting Get
// holds no thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "daemon/peer/key_scope.h"
#include "daemon/peer/token_proof.h"
#include "daemon/peer/kv_store.h"
#include "daemon/peer/peer_calls.h"
#include "daemon/peer/peer_requests.h"
#include "daemon/peer/peer_auth.h"
#include "daemon/util/tcp_listener.h"
#include "daemon/util/log.h"
#include "proto/peer.grpc.pb.h"

namespace gradsync {

// Fills in where this daemon's part of a store job is; false when it has no such job.
// Called on gRPC threads.
using ProgressLookup = std::function<bool(const std::string& store_job, peer::ProgressReply* reply)>;

class PeerService final : public peer::Peer::CallbackService {
 public:
  // `proven`: told the peer (as gRPC names it) of every call that passes authentication; may
  // be empty.
  PeerService(KvStore* store, ProgressLookup progress, std::shared_ptr<const PeerAuth> auth,
              KeyScope::JobLookup jobs = {}, std::function<void(const std::string&)> proven = {})
      : store_(store),
        scope_(store, std::move(jobs)),
        progress_(std::move(progress)),
        auth_(std::move(auth)),
        proofs_(auth_->token, service_id()),
        proven_(std::move(proven)) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const peer::SetRequest* request,
                                peer::SetReply* reply) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const peer::GetRequest* request,
                                peer::GetReply* reply) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context, const peer::AddRequest* request,
                                peer::AddReply* reply) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context, const peer::DeleteJobRequest* request,
                                      peer::DeleteJobReply* reply) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context, const peer::PingRequest* request,
                                 peer::PingReply* reply) override;
  grpc::ServerUnaryReactor* Progress(grpc::CallbackServerContext* context, const peer::ProgressRequest* request,
                                     peer::ProgressReply* reply) override;

  const PeerCallCounts& calls() const { return calls_; }

 private:
  // Answers a call without a good proof of the cluster token (UNAUTHENTICATED) and returns its
  // reactor; null when the call may go on, with *caller filled in. Without a token or TLS
  // every call but Ping is refused.
  grpc::ServerUnaryReactor* refuse(grpc::CallbackServerContext* context, std::string_view method,
                                   const google::protobuf::Message& request, PeerCaller* caller);
  // The member a call is charged to (kv_store.h): its group is its certificate (TLS) or else
  // its host; its name that and the node its proof names.
  StoreMember member_of(const grpc::CallbackServerContext& context, const std::string& node) const;
  // A random id for this daemon process, to which proofs are bound (token_proof.h).
  static std::string service_id();

  KvStore* store_;
  KeyScope scope_;  // what each caller may do with a job's keys
  ProgressLookup progress_;
  std::shared_ptr<const PeerAuth> auth_;  // never null
  ProofChecker proofs_;                   // the token's proofs, and the replay cache
  std::function<void(const std::string&)> proven_;
  PeerCallCounts calls_;  // every call that arrived, refused or not
};

struct PeerServerOptions {
  std::string listen;  // host:port
  Logger log;
  ProgressLookup progress;  // may be empty: every job is reported as not found
  std::shared_ptr<const PeerAuth> auth = std::make_shared<PeerAuth>();  // none: loopback only
  KvStore::Limits limits;
  // The jobs this daemon runs itself, for the key scope's bounds on node claims; may be empty.
  KeyScope::JobLookup jobs;
  // Bounds on peer connections (the daemon accepts them itself, tcp_listener.h).
  TcpListenerLimits connections;
};

class PeerServer {
 public:
  // Binds and starts serving; throws Error naming the address when it cannot.
  explicit PeerServer(PeerServerOptions options);
  ~PeerServer();  // aborts waiting gets, then shuts the server down

  int port() const { return port_; }
  KvStore& store() { return store_; }
  const PeerCallCounts& calls() const { return service_.calls(); }

 private:
  PeerServerOptions options_;
  KvStore store_;
  PeerService service_;
  // The daemon accepts peer connections itself and hands them to gRPC, TLS or not
  // (tcp_listener.h). Before the server: it goes after it (calls in flight tell it of their
  // proofs); stopped first by the destructor.
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// Translates a gradsync Status into a gRPC status for replies, and back for callers.
grpc::Status to_grpc(const Status& status);
Status from_grpc(const grpc::Status& status, const std::string& context);

}  // namespace gradsync
