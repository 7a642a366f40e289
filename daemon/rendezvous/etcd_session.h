// One node's session with an etcd cluster for one job: which member it talks to, and its
// leases.
//
// Members: calls go to one member at a time. A member that cannot be reached (killed,
// refusing) or whose attempt outlives its own bound (frozen, cut off) is left for the next, and
// the call is made again there, with a growing pause after each round of the members, until
// its deadline. Watches and lease renewals move the same way; a watch on a member that stops
// answering is ended by the channel's HTTP/2 pings (etcd_access.cc), and one on a member cut
// off from the leader by etcd itself ("hasleader"). etcd replicates every write, so any member
// with quorum serves.
//
// Leases: the keys a node publishes for itself live on its node lease (--etcd-lease-ttl-s,
// 10 s), renewed by a thread every third of the TTL while the session lives: when the daemon
// dies they go within the TTL. Keys that must outlive the node (counters, failure notices,
// node 0's table) live on a job lease of --peer-key-ttl-s, renewed by the same thread every
// third of its own TTL while the session lives: they go that long after the job's last
// session on the node, as the peer store keeps a job's keys that long after their last use.
// A lease etcd no longer has (it ran out while etcd was unreachable, or was revoked) is
// granted anew on the next write; what lived on the old one is gone, and the daemon logs so.
// Neither is revoked when the session ends: a node's keys outlive its session by the TTL.
//
// Authentication: with --etcd-user, the daemon's token for the member (etcd_tokens.h) goes with
// every call; a call refused for its token (expired, another member's, or older than a change of
// etcd's users) is made once more with a new one.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
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

// What one attempt of a call gets: the member's stubs (its context has the deadline and token).
struct EtcdMember {
  const std::string& address;
  etcdserverpb::KV::Stub& kv;
  etcdserverpb::Watch::Stub& watch;
  etcdserverpb::Lease::Stub& lease;
};

class EtcdSession {
 public:
  using Clock = std::chrono::steady_clock;
  // May an attempt that failed on its member be made again on another? Reads, overwrites,
  // grants (of an ID of our own) and increments (guarded by their marker key: EtcdStore::add)
  // may; a set-if-absent only when the member was never reached.
  enum class Retry { kIdempotent, kNotSent };
  // The two leases (above).
  enum class Lease { kNode, kJob };
  using Attempt = std::function<grpc::Status(EtcdMember&, grpc::ClientContext*)>;
  // How long one attempt of a unary call may take on its member before the next is tried.
  static constexpr std::chrono::milliseconds kAttemptBound{2000};

  EtcdSession(std::shared_ptr<const EtcdAccess> access, std::vector<std::string> members, Logger log);
  ~EtcdSession();  // stops the renewals; the leases run out on their own
  EtcdSession(const EtcdSession&) = delete;
  EtcdSession& operator=(const EtcdSession&) = delete;

  // "etcd at HOST:PORT,HOST:PORT"
  const std::string& describe() const { return describe_; }
  const EtcdAccess& access() const { return *access_; }

  // Makes `attempt` on the current member, each attempt bounded by `attempt_bound` (zero: the
  // call's deadline, for watches), then on the others as they fail, until it succeeds or
  // `deadline` passes; `calls` registers each attempt for cancellation. The error names the
  // member and what was done (`what`).
  Status run(EtcdCalls& calls, Clock::time_point deadline, Retry retry, const std::string& what,
             const Attempt& attempt, Clock::duration attempt_bound = kAttemptBound);

  // The lease of `kind`, granted on first use (and again once lost).
  Status lease(EtcdCalls& calls, Clock::time_point deadline, Lease kind, int64_t* id);
  // etcd no longer has lease `id` of `kind`: the next lease() grants another.
  void lease_lost(Lease kind, int64_t id);

 private:
  struct Stubs {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  // The member's token, authenticating there when the daemon has none (or `refused` was).
  Status token(EtcdCalls& calls, Stubs& member, Clock::time_point deadline, const std::string& refused,
               std::string* out);
  Status grant(EtcdCalls& calls, Clock::time_point deadline, std::chrono::seconds ttl, int64_t* id);
  // One renewal of lease `id` within `bound`; *lost when etcd no longer has it.
  Status renew(int64_t id, Clock::duration bound, const std::string& what, bool* lost);
  void keep_alive();

  std::shared_ptr<const EtcdAccess> access_;
  std::vector<Stubs> members_;
  std::string describe_;
  Logger log_;
  std::timed_mutex grant_mutex_;  // one grant at a time, so that concurrent first writes share one lease
  Mutex mutex_;
  size_t current_ GS_GUARDED_BY(mutex_) = 0;
  int64_t node_lease_ GS_GUARDED_BY(mutex_) = 0;
  int64_t job_lease_ GS_GUARDED_BY(mutex_) = 0;
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  CondVar wake_;
  EtcdCalls own_calls_;  // the renewals', cancelled when the session ends
  std::thread keeper_;   // started with the first lease; renews whichever are current
};

}  // namespace gradsync
