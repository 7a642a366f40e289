// How the nodes of a multi-node job agree on when a settings change (SetConfig) takes effect,
// through the job's keys in its rendezvous store (node 0's daemon, or etcd):
//
//   1. The daemon that got the change claims the next change number k (a counter) and
//      publishes the settings under "cfg/<k>".
//   2. Every node's watcher (worker.h) waits for "cfg/<k>", has its worker hold before the
//      first operation it has not begun (H_node), and offers H_node under "cfg/<k>/at/<node>".
//   3. Each node reads every offer: the change takes effect from E = max(H_node). Every node
//      runs the operations before E with the old settings and E onwards with the new ones;
//      the hold ends there. A node held at H < E is never waited on by one at E, because
//      deciding E needs only the watchers, not the workers.
//
// Changes are numbered, so concurrent ones apply in the same order everywhere. Publishing is
// first-writer-wins (set if absent): a number claimed for a whole minute-long wait and still not
// published (its proposer died or was cut off) is given up by the first watcher to notice,
// writing "skip" there, and every node then skips it; a late proposer learns its change was
// given up. A
// value no node can decode is skipped by all alike. A node that does not offer within the bound
// fails the job: it cannot be known whether the others applied the change, and mixed settings
// would mix buckets. Its own store handle, so that cancelling it (the job ended) leaves the
// cluster's alone. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "daemon/peer/rendezvous_store.h"
#include "shared/status.h"

namespace gradsync {

class ConfigChannel {
 public:
  // `prefix` is the job generation's key prefix ("g3/") in the store job `store_job`.
  ConfigChannel(std::shared_ptr<RendezvousStore> store, std::string store_job, std::string prefix, int node,
                int nodes);

  static constexpr char kSkip[] = "skip";

  // Claims the next change number and publishes `settings` under it.
  Status propose(const std::string& settings, std::chrono::milliseconds timeout, uint64_t* k);
  // Waits up to `timeout` for change k (kTimeout when it has not come).
  Status wait(uint64_t k, std::chrono::milliseconds timeout, std::string* settings);
  // Whether change number k has been claimed.
  Status claimed(uint64_t k, std::chrono::milliseconds timeout, bool* out);
  // Gives change k up if it is still unpublished (first writer wins: a no-op otherwise).
  Status give_up(uint64_t k, std::chrono::milliseconds timeout);
  // Offers this node's first operation not begun for change k.
  Status offer(uint64_t k, uint64_t first_not_begun, std::chrono::milliseconds timeout);
  // Every node's offer for change k; *from_seq is the largest. A timeout names the nodes that
  // did not offer.
  Status agree(uint64_t k, std::chrono::milliseconds timeout, uint64_t* from_seq);

  void cancel(const Status& why) {
    cancelled_.store(true);
    client_->cancel(why);
  }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::string key(const std::string& name) const { return prefix_ + name; }

  std::atomic<bool> cancelled_{false};
  std::shared_ptr<RendezvousStore> client_;
  std::string store_job_;
  std::string prefix_;
  int node_;
  int nodes_;
};

}  // namespace gradsync
