// Cluster: the other nodes of a multi-node job, as the worker sees them. It agrees with them on
// the job's generation and on every tensor set's layout, hands out one collective engine per
// process group that spans nodes, and turns an engine error into one that names the node at
// fault. The daemon's implementation talks to the other daemons (peer_cluster.h); worker tests
// pass a fake with fake engines. It is also the job's Rendezvous (engine/rendezvous.h), through
// which device engines agree on their ranks and NCCL ids.
//
// Threading: used on the job's worker thread, except abort(), which may come from any thread
// and never blocks.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/engine/host_engine.h"
#include "daemon/engine/rendezvous.h"
#include "daemon/model/tensor_set.h"
#include "shared/status.h"

namespace gradsync {

class ConfigChannel;

class Cluster : public Rendezvous {
 public:
  virtual ~Cluster() = default;  // closes the engines, so peers fail fast instead of timing out

  // Agrees on the generation with the other nodes and checks their local world sizes. Blocks
  // up to the job timeout; idempotent once it succeeded.
  virtual Status form() = 0;

  // Publishes this node's layout of a set and compares it with every node's; a mismatch names
  // the ranks and the first difference.
  virtual Status check_layout(const TensorSet& set) = 0;

  // The engine of `group` (created on first use; every node creates engines in the same order
  // because they commit the same sets). nullptr when the group lives on this node only.
  virtual Status engine(const std::string& group, HostCollectiveEngine** engine) = 0;

  // Turns an engine error into one that leads with the node that is gone or failed first.
  virtual Status explain(const Status& error) = 0;

  // Aborts every engine (the call in flight returns promptly) and every engine made later.
  virtual void abort(const Status& why) = 0;

  // Tells the other nodes why this node's job failed (best effort, short timeout).
  virtual void publish_failure(const Status& status) = 0;

  // This node is done with the job's generation: the last node to say so deletes the
  // generation's keys at the rendezvous (best effort, short timeout; the store's TTL covers a
  // node that never says so).
  virtual void leave() {}

  // Once formed: how the nodes agree on settings changes (null when this cluster cannot, as
  // test fakes), and every node's daemon peer address, by node (empty when unknown).
  virtual std::shared_ptr<ConfigChannel> config_channel() { return nullptr; }
  virtual std::vector<std::string> node_addresses() const { return {}; }
};

// Before a set's first operation, on the worker thread: forms the cluster, checks the set's
// layout against every node's, and makes the engines of a host set's groups, in the same
// (sorted) order on every node. Device sets get theirs from their executor.
inline Status prepare_set(Cluster& cluster, const TensorSet& set) {
  if (Status status = cluster.form(); !status.ok()) return status;
  if (Status status = cluster.check_layout(set); !status.ok()) return status;
  if (set.memory_kind != MemoryKind::kHostMemfd) return Status();
  std::set<std::string> groups;
  for (const auto& bucket : set.plan.buckets) groups.insert(bucket.group);
  for (const auto& group : groups) {
    HostCollectiveEngine* engine = nullptr;
    if (Status status = cluster.engine(group, &engine); !status.ok()) return status;
  }
  return Status();
}

}  // namespace gradsync
