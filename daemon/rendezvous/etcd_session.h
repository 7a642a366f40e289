// One node's session with an etcd cluster for one job: which member it talks to, its
// authentication token, and its leases.
//
// Members: calls go to one member at a time; a member that cannot be reached (killed,
// partitioned) is left for the next, and the call is made again there within its deadline.
// Watches and keep-alives move the same way. etcd replicates every write, so any member with
// quorum serves.
//
// Leases: the keys a node publishes live on its node lease (--etcd-lease-ttl-s, 10 s), kept
// alive by a thread while the session lives: when the daemon dies they go within the TTL.
// Counters (the job's incarnations) live on a counter lease of --peer-key-ttl-s, so that
// they outlive the nodes that count, as the peer store's do. Neither is revoked when the
// session ends: a node's failure notice stays readable for the TTL after it gave up.
//
// Authentication: with --etcd-user, a token from Authenticate goes with every call, and a call
// refused for its token is made once more with a new one (etcd's simple tokens are per member
// and expire).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/rendezvous/etcd_access.h"
#include "daemon/util/log.h"
#include "proto/etcd/rpc.grpc.pb.h"
#include "shared/mutex.h"
#include "shared/status.h"

namespace gradsync {

// The calls in flight of one store handle, so that cancel() ends them (EtcdStore::cancel).
class EtcdCalls {
 public:
  // Registers `context`; refused with the reason once cancelled.
  Status enter(grpc::ClientContext* context);
  void leave(grpc::ClientContext* context);
  void cancel(const Status& why);
  Status cancelled() const;

 private:
  mutable Mutex mutex_;
  std::set<grpc::ClientContext*> in_flight_ GS_GUARDED_BY(mutex_);
  Status cancelled_ GS_GUARDED_BY(mutex_);
};

// What one attempt of a call gets: the member's stubs and the call's context (deadline and
// token set).
struct EtcdMember {
  const std::string& address;
  etcdserverpb::KV::Stub& kv;
  etcdserverpb::Watch::Stub& watch;
  etcdserverpb::Lease::Stub& lease;
};

class EtcdSession {
 public:
  using Clock = std::chrono::steady_clock;
  // May an attempt that failed as unreachable be made again on another member? Reads and
  // overwrites may; a counter's increment only when the member was never reached.
  enum class Retry { kIdempotent, kNotSent };
  using Attempt = std::function<grpc::Status(EtcdMember&, grpc::ClientContext*)>;

  EtcdSession(std::shared_ptr<const EtcdAccess> access, std::vector<std::string> members, Logger log);
  ~EtcdSession();  // stops the keep-alive; the leases run out on their own
  EtcdSession(const EtcdSession&) = delete;
  EtcdSession& operator=(const EtcdSession&) = delete;

  // "etcd at HOST:PORT,HOST:PORT"
  const std::string& describe() const { return describe_; }
  const EtcdAccess& access() const { return *access_; }

  // Makes `attempt` on the current member, then on the others as they prove unreachable, until
  // it succeeds or `deadline` passes; `calls` registers each attempt for cancellation. The error
  // names the member and what was done (`what`).
  Status run(EtcdCalls& calls, Clock::time_point deadline, Retry retry, const std::string& what,
             const Attempt& attempt);

  // The node lease (granted on first use, then kept alive) and the counter lease.
  Status node_lease(EtcdCalls& calls, Clock::time_point deadline, int64_t* id);
  Status counter_lease(EtcdCalls& calls, Clock::time_point deadline, int64_t* id);

 private:
  struct Stubs {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  Status grant(EtcdCalls& calls, Clock::time_point deadline, std::chrono::seconds ttl, int64_t* id);
  // A new token from `member`; kept for every later call.
  Status authenticate(Stubs& member, Clock::time_point deadline);
  void keep_alive();

  std::shared_ptr<const EtcdAccess> access_;
  std::vector<Stubs> members_;
  std::string describe_;
  Logger log_;
  Mutex mutex_;
  size_t current_ GS_GUARDED_BY(mutex_) = 0;
  std::string token_ GS_GUARDED_BY(mutex_);
  int64_t node_lease_ GS_GUARDED_BY(mutex_) = 0;
  int64_t counter_lease_ GS_GUARDED_BY(mutex_) = 0;
  Mutex lease_mutex_;  // one grant at a time, so that concurrent first calls share one lease
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  CondVar wake_;
  EtcdCalls own_calls_;  // the keep-alive's, cancelled when the session ends
  std::thread keeper_;   // started with the node lease
};

}  // namespace gradsync
