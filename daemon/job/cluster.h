// The nodes of a multi-node job, as seen from one daemon: forms the job's generation through
// the rendezvous daemon's peer service, checks that every node registered the same layouts,
// creates one collective engine per process group that spans nodes, and explains engine
// failures by finding out which node is gone. Used on the job's worker thread, except abort().
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mutex>

#include "daemon/engine/engine.h"
#include "daemon/engine/factory.h"
#include "daemon/job/tensor_set.h"
#include "daemon/job/topology.h"
#include "daemon/peer/peer_client.h"
#include "daemon/util/log.h"

namespace gradsync {

struct ClusterOptions {
  std::string job_id;           // for messages
  // The job's namespace in the rendezvous store: "<uid>.<job id>", so that two users' jobs of
  // the same id never share keys (user ids are assumed to agree across nodes).
  std::string store_job;
  Topology topology;
  std::chrono::milliseconds timeout{30'000};
  std::string rendezvous;       // host:port of the node-0 daemon's peer service
  std::string advertise;        // host:port other daemons reach this daemon's peer service at
  EngineFactory* engines = nullptr;  // makes one engine per group that spans nodes
  Logger log;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options);

  // Agrees on the generation with the other nodes and checks their local world sizes. Blocks
  // up to the timeout; idempotent once it succeeded.
  Status form();

  // Publishes this node's layout of a set and compares it with every node's; a mismatch names
  // the ranks and the first difference.
  Status check_layout(const TensorSet& set);

  // The engine of `group` (created on first use; every node creates engines in the same order
  // because they commit the same sets). nullptr when the group lives on this node only.
  Status engine(const std::string& group, CollectiveEngine** engine);

  // Turns an engine error into one that names the node that is gone or that failed first.
  Status explain(const Status& error);

  // Aborts every engine (the call in flight returns promptly) and every engine made later.
  // Thread-safe: the job calls it when it fails, while the worker may be blocked in a call.
  void abort(const Status& why);

  // Tells the other nodes why this node's job failed (best effort, short timeout).
  void publish_failure(const Status& status);

  // "node 2 (ranks 4-5, gradsyncd at host:port)"
  std::string describe_node(int node) const;

 private:
  std::string key(const std::string& name) const { return prefix_ + name; }

  ClusterOptions options_;
  std::shared_ptr<PeerClient> rendezvous_;
  bool formed_ = false;
  std::string prefix_;                  // "g<generation>/"
  std::vector<std::string> addresses_;  // peer address of every node
  std::mutex engines_mutex_;  // engines_ and aborted_: the worker adds, abort() may come from anywhere
  std::map<std::string, std::unique_ptr<CollectiveEngine>> engines_;
  Status aborted_;
};

}  // namespace gradsync
