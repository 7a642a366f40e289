// The rendezvous store over an etcd v3 cluster (--rendezvous etcd://...): the nodes of a job
// meet in etcd instead of at node 0's daemon, so no node is a single point of failure and a
// large cluster's formation traffic lands on etcd's members.
//
// Keys are "<--etcd-prefix><store job>/<key>". A set puts the key on this node's lease
// (etcd_session.h), so it goes when the node's daemon dies; publish() and counters use the
// job's lease, which outlives the node; a get reads its keys in
// transactions and waits for the missing ones with a watch from the revision it read at, so
// nothing polls and nothing between the read and the watch is missed; a counter is a key's
// version (every put raises it by one, atomically), so add() is one transaction, never a
// retried compare-and-swap: it puts the counter only if the increment's own marker key is
// absent, and creates the marker, so a copy of it resent after a lost answer, or committing
// late, counts once (count_once).
//
// Each handle has its own cancellation; fresh() shares the session (its member, token and
// leases) with a handle that is not cancelled.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/peer/rendezvous_store.h"
#include "daemon/rendezvous/etcd_session.h"

namespace gradsync {

class EtcdStore final : public RendezvousStore {
 public:
  explicit EtcdStore(std::shared_ptr<EtcdSession> session) : session_(std::move(session)) {}

  std::string describe() const override { return session_->describe(); }
  Status set(const std::string& job, const std::string& key, const std::string& value,
             std::chrono::milliseconds timeout) override;
  Status publish(const std::string& job, const std::string& key, const std::string& value,
                 std::chrono::milliseconds timeout) override;
  Status set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                       std::chrono::milliseconds timeout, bool* stored) override;
  Status get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
             std::vector<std::string>* values) override;
  Status peek(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
              std::vector<std::optional<std::string>>* values) override;
  // Deltas 0 (a read) and 1 only: the counter is the key's version.
  Status add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
             int64_t* value) override;
  Status delete_job(const std::string& job, std::chrono::milliseconds timeout, const std::string& prefix) override;
  // add(delta 1) as increment `nonce`: however often it is made, it counts once, and each time
  // *value is the count it made. Public for the tests (the same nonce twice).
  Status count_once(const std::string& job, const std::string& key, const std::string& nonce,
                    std::chrono::milliseconds timeout, int64_t* value);
  void cancel(const Status& why) override { calls_.cancel(why); }
  std::shared_ptr<RendezvousStore> fresh() const override { return std::make_shared<EtcdStore>(session_); }

 private:
  using Clock = EtcdSession::Clock;
  using Lease = EtcdSession::Lease;
  // One write on the lease of `kind`, made once more on a new lease when etcd no longer has
  // that one. `attempt` puts with the lease it is given.
  using LeasedAttempt = std::function<grpc::Status(EtcdMember&, grpc::ClientContext*, int64_t lease)>;
  Status write(Lease kind, Clock::time_point deadline, EtcdSession::Retry retry, const std::string& what,
               const LeasedAttempt& attempt);
  Status put(Lease kind, const std::string& job, const std::string& key, const std::string& value,
             std::chrono::milliseconds timeout);
  std::string path(const std::string& job, const std::string& key) const;
  // Reads `paths` (full etcd keys) in transactions of a bounded number of ranges into
  // `found`; *revision is the oldest revision read at.
  Status read(const std::vector<std::string>& paths, Clock::time_point deadline,
              std::vector<std::optional<std::string>>* found, int64_t* revision);
  // Watches from `revision` until every path in `found` has a value or the deadline passes.
  // *compacted when etcd no longer has that revision (read again, then watch).
  Status watch(const std::vector<std::string>& paths, int64_t revision, Clock::time_point deadline,
               std::vector<std::optional<std::string>>* found, bool* compacted);

  std::shared_ptr<EtcdSession> session_;
  EtcdCalls calls_;
};

}  // namespace gradsync
