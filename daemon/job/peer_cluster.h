// The Cluster of a multi-node job: forms the job's generation through its rendezvous store
// (node 0's peer service, or etcd: peer/rendezvous_store.h), checks that every node registered the same
// layouts, creates one collective engine per process group that spans nodes through the engine
// factory, and explains engine failures by asking the other daemons (their peer services)
// which node is gone.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>


#include "daemon/job/cluster.h"
#include "daemon/job/node_record.h"
#include "daemon/engine/factory.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/rendezvous_store.h"
#include "daemon/util/log.h"
#include "shared/mutex.h"

namespace gradsync {

struct ClusterOptions {
  std::string job_id;           // for messages
  // The job's namespace in the rendezvous store: "<uid>.<job id>", so that two users' jobs of
  // the same id never share keys (user ids are assumed to agree across nodes).
  std::string store_job;
  Topology topology;
  std::chrono::milliseconds timeout{30'000};
  std::string rendezvous;       // as the trainers named it: node 0's peer service, or etcd://...
  std::shared_ptr<RendezvousStore> store;  // the store it names (rendezvous/store_opener.h)
  std::string advertise;        // host:port other daemons reach this daemon's peer service at
  HostEngineFactory* engines = nullptr;  // makes one engine per group that spans nodes
  std::shared_ptr<const PeerAuth> auth;  // how this daemon proves membership to its peers
  Logger log;
};

class PeerCluster final : public Cluster {
 public:
  explicit PeerCluster(ClusterOptions options);

  Status form() override;
  Status check_layout(const TensorSet& set) override;
  Status engine(const std::string& group, HostCollectiveEngine** engine) override;
  int node() const override { return options_.topology.node; }
  int nodes() const override { return options_.topology.nodes; }
  // Under "x/<name>/<node>" in this generation's keys; a timeout names the nodes that did not
  // offer their value, and whether each is slow or gone.
  Status exchange(const std::string& name, const std::string& mine, std::vector<std::string>* all) override;
  Status explain(const Status& error) override;
  void abort(const Status& why) override;
  void publish_failure(const Status& status) override;
  void leave() override;
  std::shared_ptr<ConfigChannel> config_channel() override;
  std::vector<std::string> node_addresses() const override { return addresses_; }

  // "node 2 (ranks 4-5, gradsyncd at host:port)"
  std::string describe_node(int node) const;

 private:
  std::string key(const std::string& name) const { return prefix_ + name; }
  // What the other daemons say about `nodes`: whether each answers a ping (in parallel,
  // bounded by a probe timeout) and the failure it published, if any.
  struct NodeState {
    bool asked = true;  // false: the probe's bound passed before its ping started: unknown
    bool answers = false;
    std::optional<std::string> failure;
  };
  std::map<int, NodeState> probe(const std::vector<int>& nodes) const;
  // "node 2 (...), which failed: ...", "..., which is slow, not gone: its daemon answers", or
  // "..., which is gone: its daemon does not answer".
  std::string whereabouts(int node, const std::map<int, NodeState>& states) const;
  // The nodes whose key of `keys` (one per node) is not in the store yet, each with its
  // whereabouts: "node 2 (...), which is gone: ...; node 3 ...".
  std::string late_nodes(const std::vector<std::string>& keys) const;
  // Formation: node 0 reads every node's record in node order and publishes them as one table
  // (or why it refuses the job); the others read node 0's record, then the table.
  Status publish_table(const NodeRecord& me, std::vector<NodeRecord>* records);
  Status read_table(const NodeRecord& me, std::vector<NodeRecord>* records);
  // Node `node`'s record `text`, checked against this node's `me`.
  Status check_record(int node, const std::string& text, const NodeRecord& me, NodeRecord* out) const;
  std::string did_not_join(int node, const Status& status) const;
  Status aborted();

  ClusterOptions options_;
  std::shared_ptr<RendezvousStore> rendezvous_;
  // Whether the store is node 0's daemon: then it is pinged before its notices are read.
  bool store_on_node0_ = true;
  bool formed_ = false;
  // publish_failure() found the rendezvous gone: leave() does not try it again.
  bool rendezvous_unreachable_ = false;
  std::string prefix_;                  // "g<generation>/"
  std::vector<std::string> addresses_;  // peer address of every node
  Mutex engines_mutex_;  // the worker adds engines, abort() may come from anywhere
  std::map<std::string, std::unique_ptr<HostCollectiveEngine>> engines_ GS_GUARDED_BY(engines_mutex_);
  Status aborted_ GS_GUARDED_BY(engines_mutex_);
};

}  // namespace gradsync
