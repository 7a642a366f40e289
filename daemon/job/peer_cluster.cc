#include "daemon/job/peer_cluster.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "daemon/job/config_channel.h"
#include "daemon/job/layout_record.h"
#include "daemon/job/node_record.h"
#include "daemon/peer/peer_pings.h"
#include "daemon/plan/layout.h"
#include "daemon/rendezvous/etcd_access.h"
#include "daemon/util/safe_text.h"

namespace gradsync {
namespace {

// The head line of node 0's table of the nodes: the records follow, or the refusal's code and
// text.
constexpr char kTableOk[] = "nodes";
constexpr char kTableRefused[] = "refused";
// How much longer than the job timeout the other nodes wait for node 0's table: node 0 has the
// job timeout from its arrival, and publishing takes a call.
constexpr auto kTableSlack = std::chrono::milliseconds(2000);

// How long explain() waits for a peer daemon to answer before calling it unreachable.
constexpr auto kProbeTimeout = std::chrono::milliseconds(1000);
// How long explain() keeps asking for a failure notice when a peer reset its connections while
// its daemon answers (a node that failed the job publishes why after it closed them).
constexpr auto kNoticeWait = std::chrono::milliseconds(2000);

}  // namespace

PeerCluster::PeerCluster(ClusterOptions options)
    : options_(std::move(options)),
      rendezvous_(options_.store ? options_.store : std::make_shared<PeerClient>(options_.rendezvous, options_.auth)),
      store_on_node0_(!is_etcd_rendezvous(options_.rendezvous)) {}

std::string PeerCluster::describe_node(int node) const {
  const int l = options_.topology.local_world_size;
  std::string text = "node " + std::to_string(node) + " (ranks " + std::to_string(node * l) + "-" +
                     std::to_string(node * l + l - 1);
  if (static_cast<size_t>(node) < addresses_.size()) text += ", gradsyncd at " + addresses_[static_cast<size_t>(node)];
  return text + ")";
}

Status PeerCluster::form() {
  if (formed_) return Status();
  const Topology& t = options_.topology;
  const std::string& job = options_.job_id;
  const std::string& store = options_.store_job;
  // Every node bumps the job's counter once per incarnation, so the n-th incarnation of every
  // node lands in the same generation and never sees an older one's keys.
  int64_t joined = 0;
  Status status = rendezvous_->add(store, "incarnations", 1, options_.timeout, &joined);
  if (!status.ok()) {
    // The store's own message names it ("peer daemon at ...", "etcd at ...").
    const bool unreachable = status.code() == ErrorCode::kPeerLost || status.code() == ErrorCode::kTimeout;
    return Status(status.code(), "job " + job + (unreachable ? ": cannot reach the rendezvous: "
                                                             : ": the rendezvous refused the job's first call: ") +
                                     status.message());
  }
  if (joined < 1) {
    return Status::protocol("job " + job + ": the rendezvous (" + rendezvous_->describe() + ") counted " +
                            std::to_string(joined) + " incarnations after this node's: not a count");
  }
  prefix_ = "g" + std::to_string((joined - 1) / t.nodes) + "/";
  const NodeRecord me = NodeRecord::mine(t.local_world_size, options_.advertise);
  const std::string mine = me.encode();
  // Said here, naming this node, rather than by every node as a record it cannot read.
  if (!NodeRecord::parse(mine)) {
    return Status::invalid_argument("job " + job + ": this node's peer address '" + safe_text(options_.advertise, 300) +
                                    "' cannot be published: give gradsyncd a --peer-advertise host of printable "
                                    "ASCII without spaces");
  }
  if (status = rendezvous_->set(store, key("node/" + std::to_string(t.node)), mine, options_.timeout); !status.ok()) {
    return status;
  }
  // Node 0 reads the records node by node, so that a node that differs is refused as soon as
  // it arrives rather than after waiting for nodes that never come, and publishes them as one
  // table (or the refusal) that the other nodes read in one call: N + 2 calls per node at the
  // rendezvous in all, where every node reading every record made N² (4,096 at 64 nodes).
  std::vector<NodeRecord> records;
  status = t.node == 0 ? publish_table(me, &records) : read_table(me, &records);
  if (Status why = aborted(); !why.ok()) return why;  // cancelled: this node gave up
  if (!status.ok()) return status;
  addresses_.clear();
  for (const NodeRecord& record : records) addresses_.push_back(record.address);
  formed_ = true;
  options_.log.info("formed across " + std::to_string(t.nodes) + " nodes as node " + std::to_string(t.node) +
                    " (" + prefix_ + " at " + rendezvous_->describe() + ")");
  return Status();
}

Status PeerCluster::check_record(int node, const std::string& text, const NodeRecord& me, NodeRecord* out) const {
  const std::string& job = options_.job_id;
  const std::optional<NodeRecord> theirs = NodeRecord::parse(text);
  if (!theirs) {
    return Status::protocol("job " + job + ": node " + std::to_string(node) +
                            " published a formation record that this gradsyncd cannot read: not one a gradsyncd writes");
  }
  // First: a node of another protocol may mean something else by the rest of its record.
  if (theirs->protocol != me.protocol) {
    return Status::invalid_argument("job " + job + ": node " + std::to_string(node) + " (gradsyncd at " +
                                    theirs->address + ") runs " + theirs->describe_version() + ", node " +
                                    std::to_string(options_.topology.node) + " runs " + me.describe_version() +
                                    ": every node of a job must run a gradsyncd of the same cross-node protocol");
  }
  if (theirs->local_world_size != me.local_world_size) {
    return Status::invalid_argument("job " + job + ": local world sizes differ: node " +
                                    std::to_string(options_.topology.node) + " has " +
                                    std::to_string(me.local_world_size) + " ranks, node " + std::to_string(node) +
                                    " has " + std::to_string(theirs->local_world_size));
  }
  *out = *theirs;
  return Status();
}

std::string PeerCluster::did_not_join(int node, const Status& status) const {
  return "job " + options_.job_id + ": node " + std::to_string(node) + " of " +
         std::to_string(options_.topology.nodes) + " did not join within " +
         std::to_string(options_.timeout.count()) + " ms: " + status.message();
}

Status PeerCluster::publish_table(const NodeRecord& me, std::vector<NodeRecord>* records) {
  const std::string& store = options_.store_job;
  std::string table = kTableOk;
  Status status;
  // One bound for the whole loop, the job timeout from node 0's arrival: the other nodes wait for
  // the table that long (and a little more) from the moment node 0's record appears.
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  for (int n = 0; n < options_.topology.nodes && status.ok(); ++n) {
    std::vector<std::string> values;
    const auto left = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                  deadline - std::chrono::steady_clock::now()));
    status = rendezvous_->get(store, {key("node/" + std::to_string(n))}, left, &values);
    if (!status.ok()) {
      status = Status(status.code(), did_not_join(n, status));
      break;
    }
    NodeRecord record;
    status = check_record(n, values[0], me, &record);
    if (status.ok()) {
      records->push_back(record);
      table += "\n" + values[0];
    }
  }
  if (Status why = aborted(); !why.ok()) return why;  // nothing to tell: publish_failure does
  // The refusal carries its code and text, so that every node fails with node 0's words.
  if (!status.ok()) table = std::string(kTableRefused) + " " + std::to_string(static_cast<int>(status.code())) + "\n" + status.message();
  const Status published = rendezvous_->publish(store, key("table/0"), table, options_.timeout);
  return status.ok() ? published : status;
}

Status PeerCluster::read_table(const NodeRecord& me, std::vector<NodeRecord>* records) {
  const std::string& store = options_.store_job;
  const int nodes = options_.topology.nodes;
  // Node 0's record first: another protocol (whose node 0 may publish no table) or another local
  // world size (whose node 0 expects another node count) is refused at once, naming both.
  std::vector<std::string> values;
  Status status = rendezvous_->get(store, {key("node/0")}, options_.timeout, &values);
  if (!status.ok()) return Status(status.code(), did_not_join(0, status));
  NodeRecord first;
  if (status = check_record(0, values[0], me, &first); !status.ok()) return status;
  status = rendezvous_->get(store, {key("table/0")}, options_.timeout + kTableSlack, &values);
  if (Status why = aborted(); !why.ok()) return why;
  if (!status.ok()) {
    // Node 0 publishes the table, or its refusal, within the job timeout of its arrival, unless
    // it failed meanwhile: then its failure notice says why.
    std::vector<std::string> notice;
    const bool failed =
        rendezvous_->get(store, {key("failure/0")}, std::chrono::milliseconds(0), &notice).ok();
    return Status(status.code(), "job " + options_.job_id + ": node 0 did not publish the nodes' records within " +
                                     std::to_string((options_.timeout + kTableSlack).count()) + " ms of arriving" +
                                     (failed ? ": it failed: " + safe_text(notice[0], 1000) : ": " + status.message()));
  }
  const std::string& table = values[0];
  const size_t line = table.find('\n');
  const std::string head = table.substr(0, line);
  if (head.rfind(kTableRefused, 0) == 0) {
    int code = 0;
    try {
      code = std::stoi(head.substr(std::string(kTableRefused).size()));
    } catch (const std::exception&) {
    }
    const auto known = code > 0 && code <= static_cast<int>(ErrorCode::kResourceExhausted) ? static_cast<ErrorCode>(code)
                                                                                          : ErrorCode::kProtocol;
    return Status(known, line == std::string::npos ? "node 0 refused the job" : safe_text(table.substr(line + 1), 2000));
  }
  std::istringstream in(line == std::string::npos ? std::string() : table.substr(line + 1));
  std::string text;
  for (int n = 0; head == kTableOk && n < nodes && std::getline(in, text); ++n) {
    NodeRecord record;
    if (status = check_record(n, text, me, &record); !status.ok()) return status;
    records->push_back(record);
  }
  if (head != kTableOk || static_cast<int>(records->size()) != nodes || std::getline(in, text)) {
    return Status::protocol("job " + options_.job_id + ": node 0 published a table of the nodes that this gradsyncd "
                            "cannot read: not one a gradsyncd writes");
  }
  return Status();
}

void PeerCluster::leave() {
  // The failure notice just now could not reach the rendezvous: nor would this, and it would
  // wait out its own deadline too (a stopping daemon's exit waited for both, one after the other).
  if (!formed_ || rendezvous_unreachable_) return;
  // A fresh handle: the cluster's own may have been cancelled by the abort that ended the job.
  const std::shared_ptr<RendezvousStore> rendezvous = rendezvous_->fresh();
  int64_t ended = 0;
  if (!rendezvous->add(options_.store_job, key("ended"), 1, kProbeTimeout, &ended).ok()) return;
  if (ended == options_.topology.nodes) {
    const Status deleted = rendezvous->delete_job(options_.store_job, kProbeTimeout, prefix_);
    options_.log.debug("every node left " + prefix_ + "; its keys at the rendezvous: " +
                       (deleted.ok() ? std::string("deleted") : deleted.to_string()));
  }
}

std::shared_ptr<ConfigChannel> PeerCluster::config_channel() {
  if (!formed_) return nullptr;
  return std::make_shared<ConfigChannel>(rendezvous_->fresh(), options_.store_job, prefix_, options_.topology.node,
                                         options_.topology.nodes);
}

Status PeerCluster::check_layout(const TensorSet& set) {
  const Topology& t = options_.topology;
  const std::string base = "set/" + std::to_string(set.id) + "/layout/";
  Status status = rendezvous_->set(options_.store_job, key(base + std::to_string(t.node)), encode_layout(set),
                                   options_.timeout);
  if (!status.ok()) return status;
  std::vector<std::string> keys;
  for (int n = 0; n < t.nodes; ++n) keys.push_back(key(base + std::to_string(n)));
  std::vector<std::string> values;
  status = rendezvous_->get(options_.store_job, keys, options_.timeout, &values);
  if (Status why = aborted(); !why.ok()) return why;  // cancelled: this node gave up
  if (!status.ok() && status.code() == ErrorCode::kTimeout) {
    // Name the nodes that did not register it, and tell a slow one from a gone one.
    return Status::timeout("job " + options_.job_id + ": " + set.name() + " was not registered within " +
                           std::to_string(options_.timeout.count()) + " ms (the job timeout) on " + late_nodes(keys));
  }
  if (!status.ok()) {
    return Status(status.code(), "job " + options_.job_id + ": " + set.name() +
                                     " was not registered on every node: " + status.message());
  }
  uint64_t fp0 = 0, cap0 = 0;
  int gather0 = 0;
  MaskRecord mask0;
  std::vector<plan::TensorLayout> layout0;
  const size_t most = set.layout.size() + 1;
  size_t total0 = 0;
  if (!decode_layout(values[0], most, &fp0, &cap0, &gather0, &mask0, &layout0, &total0)) {
    return Status::protocol("undecodable layout from node 0");
  }
  for (int n = 1; n < t.nodes; ++n) {
    uint64_t fp = 0, cap = 0;
    int gather = 0;
    MaskRecord mask;
    std::vector<plan::TensorLayout> layout;
    size_t total = 0;
    if (!decode_layout(values[static_cast<size_t>(n)], most, &fp, &cap, &gather, &mask, &layout, &total)) {
      return Status::protocol("undecodable layout from node " + std::to_string(n));
    }
    const std::string where = "job " + options_.job_id + ": " + set.name() + " differs between " +
                              describe_node(0) + " and " + describe_node(n) + ": ";
    if (fp != fp0) {
      // The tensors both kept first (a differing one is the sharper clue), then the full counts.
      const size_t common = std::min(layout0.size(), layout.size());
      const int rank = n * t.local_world_size;
      auto diff = plan::first_difference(std::span(layout0).first(common), 0, std::span(layout).first(common), rank);
      if (!diff && total0 != total) {
        diff = "rank 0 registered " + std::to_string(total0) + " tensors, rank " + std::to_string(rank) +
               " registered " + std::to_string(total);
      }
      return Status::layout_mismatch(where + diff.value_or("layouts differ"));
    }
    if (cap != cap0) return Status::layout_mismatch(where + "bucket caps " + std::to_string(cap0) + " and " + std::to_string(cap));
    if ((gather ^ gather0) & kGatherOutput) {
      return Status::layout_mismatch(where + "only one registered an allgather output");
    }
    if ((gather ^ gather0) & kShardOutput) {
      return Status::layout_mismatch(where + "only one registered a reduce-scatter output");
    }
    if (!(mask == mask0)) {
      const auto kept = [](const MaskRecord& m) {
        return m.count == 0 ? std::string("no mask") : "a mask keeping " + std::to_string(m.count) + " elements";
      };
      return Status::layout_mismatch(where + "node 0 registered " + kept(mask0) + ", node " + std::to_string(n) + " " +
                                     kept(mask) + (mask.count == mask0.count ? " (other indices)" : "") +
                                     "; every rank gives the same mask");
    }
  }
  return Status();
}

Status PeerCluster::engine(const std::string& group, HostCollectiveEngine** engine) {
  *engine = nullptr;
  const std::vector<int> nodes = options_.topology.nodes_of(group);
  // A group on one node needs no engine; a group without ranks here does not involve this node.
  if (nodes.size() <= 1 || std::find(nodes.begin(), nodes.end(), options_.topology.node) == nodes.end()) {
    return Status();
  }
  {
    MutexLock lock(engines_mutex_);
    if (!aborted_.ok()) return aborted_;
    auto it = engines_.find(group);
    if (it != engines_.end()) {
      *engine = it->second.get();
      return Status();
    }
  }
  EngineSpec spec;
  spec.rendezvous = rendezvous_;
  spec.job = options_.store_job;
  spec.prefix = key("group/" + group + "/");
  spec.node = static_cast<int>(std::find(nodes.begin(), nodes.end(), options_.topology.node) - nodes.begin());
  spec.nodes = static_cast<int>(nodes.size());
  spec.timeout = options_.timeout;
  std::unique_ptr<HostCollectiveEngine> made;
  if (Status status = options_.engines->make(spec, &made); !status.ok()) return explain(status);
  options_.log.info("group '" + group + "': engine of " + std::to_string(nodes.size()) + " nodes ready");
  MutexLock lock(engines_mutex_);
  if (!aborted_.ok()) made->abort(aborted_);
  *engine = made.get();
  engines_.emplace(group, std::move(made));
  return Status();
}

Status PeerCluster::exchange(const std::string& name, const std::string& mine, std::vector<std::string>* all) {
  if (!formed_) return Status::internal("job " + options_.job_id + ": exchange before the job formed");
  const Topology& t = options_.topology;
  const std::string base = "x/" + name + "/";
  Status status = rendezvous_->set(options_.store_job, key(base + std::to_string(t.node)), mine, options_.timeout);
  std::vector<std::string> keys;
  for (int n = 0; n < t.nodes; ++n) keys.push_back(key(base + std::to_string(n)));
  if (status.ok()) status = rendezvous_->get(options_.store_job, keys, options_.timeout, all);
  if (Status why = aborted(); !why.ok()) return why;  // cancelled: this node gave up
  if (status.ok()) return status;
  if (status.code() != ErrorCode::kTimeout) {
    return Status(status.code(), "job " + options_.job_id + ": exchanging '" + name + "': " + status.message());
  }
  return Status::timeout("job " + options_.job_id + ": '" + name + "' was not offered within " +
                         std::to_string(options_.timeout.count()) + " ms (the job timeout) by " + late_nodes(keys));
}

std::string PeerCluster::late_nodes(const std::vector<std::string>& keys) const {
  std::vector<int> late;
  std::vector<std::optional<std::string>> there;
  if (!rendezvous_->peek(options_.store_job, keys, kProbeTimeout, &there).ok()) there.clear();
  for (int n = 0; n < options_.topology.nodes; ++n) {
    if (static_cast<size_t>(n) >= there.size() || !there[static_cast<size_t>(n)]) late.push_back(n);
  }
  const std::map<int, NodeState> states = probe(late);
  std::string named;
  for (int n : late) named += (named.empty() ? "" : "; ") + whereabouts(n, states);
  return named.empty() ? "some node" : named;
}

void PeerCluster::abort(const Status& why) {
  MutexLock lock(engines_mutex_);
  if (!aborted_.ok()) return;
  aborted_ = why;
  for (auto& [group, engine] : engines_) engine->abort(why);
  // Formation and mesh set-up wait on the rendezvous (up to the job timeout each): end them.
  rendezvous_->cancel(why);
}

std::map<int, PeerCluster::NodeState> PeerCluster::probe(const std::vector<int>& nodes) const {
  // Pings run at once, not one after another: a job of many nodes with several gone must not
  // hold its worker for a probe timeout per node. A rendezvous at node 0's daemon is pinged
  // too, whether asked about or not: its failure notices are read only when it answers, since
  // every read of a frozen one would wait out its own deadline (2 s each, one node after
  // another: 9 s at 4 nodes before this). Notices in etcd are read in one bounded call.
  const int self = options_.topology.node;
  std::vector<int> asked;
  for (int n : nodes) {
    if (n == self || static_cast<size_t>(n) >= addresses_.size()) continue;
    asked.push_back(n);
  }
  std::vector<int> pinged = asked;
  if (store_on_node0_ && self != 0 && !addresses_.empty() && std::find(asked.begin(), asked.end(), 0) == asked.end()) {
    pinged.insert(pinged.begin(), 0);  // first: asked whatever else the bound leaves unasked
  }
  // All at once, with one bound for them all whatever the node count, and no thread per node
  // (peer_pings.h): at most 256 open at a time; a node not reached by the bound is not asked,
  // which says nothing of it, rather than silent.
  std::vector<std::string> targets;
  for (int n : pinged) targets.push_back(addresses_[static_cast<size_t>(n)]);
  const std::vector<PingAnswer> heard = ping_all(targets, options_.auth, kProbeTimeout);
  std::map<int, PingAnswer> answers;
  for (size_t i = 0; i < pinged.size(); ++i) answers[pinged[i]] = heard[i];
  const auto heard_of = [&](int n) {
    auto it = answers.find(n);
    return it == answers.end() ? PingAnswer::kNotAsked : it->second;
  };
  const bool rendezvous_answers = !store_on_node0_ || self == 0 || heard_of(0) == PingAnswer::kAnswers;
  std::vector<std::string> notices;
  for (int n : asked) notices.push_back(key("failure/" + std::to_string(n)));
  std::vector<std::optional<std::string>> read;
  // A fresh handle: ours may be cancelled by now.
  if (!rendezvous_answers || !rendezvous_->fresh()->peek(options_.store_job, notices, kProbeTimeout, &read).ok()) {
    read.clear();
  }
  std::map<int, NodeState> states;
  for (size_t i = 0; i < asked.size(); ++i) {
    NodeState& state = states[asked[i]];
    state.asked = heard_of(asked[i]) != PingAnswer::kNotAsked;
    state.answers = heard_of(asked[i]) == PingAnswer::kAnswers;
    if (i < read.size()) state.failure = read[i];
  }
  return states;
}

std::string PeerCluster::whereabouts(int node, const std::map<int, NodeState>& states) const {
  auto it = states.find(node);
  if (it == states.end()) return describe_node(node);
  if (it->second.failure) return describe_node(node) + ", which failed: " + safe_text(*it->second.failure, 1000);
  if (!it->second.asked) return describe_node(node) + ", which was not asked (the probe's bound passed first)";
  if (it->second.answers) return describe_node(node) + ", which is slow, not gone: its daemon answers";
  return describe_node(node) + ", which is gone: its daemon does not answer";
}

Status PeerCluster::aborted() {
  MutexLock lock(engines_mutex_);
  return aborted_;
}

Status PeerCluster::explain(const Status& error) {
  // This node gave up on purpose (its job failed or the daemon stops): nobody else is to blame.
  if (Status why = aborted(); !why.ok()) return why;
  std::vector<int> others;
  for (int n = 0; n < options_.topology.nodes; ++n) others.push_back(n);
  std::map<int, NodeState> states = probe(others);
  // A peer that closed its connections while its daemon still answers has, most likely, failed
  // the job itself: it aborts its engines at once and publishes why only after its bucket in
  // flight is back (Worker::shut_down), so the notice may be a moment behind the reset. Asked
  // again, within a bound, so that the error names that node and its cause.
  const auto blamed = [](const std::map<int, NodeState>& s) {
    return std::any_of(s.begin(), s.end(), [](const auto& entry) {
      return entry.second.failure || (entry.second.asked && !entry.second.answers);
    });
  };
  const auto notice_deadline = std::chrono::steady_clock::now() + kNoticeWait;
  // (An abort meanwhile, of this node's own job, ends the wait but not the explanation: the
  // peer's reset came first.)
  while (error.code() == ErrorCode::kPeerLost && !blamed(states) && aborted().ok() &&
         std::chrono::steady_clock::now() < notice_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    states = probe(others);
  }
  // Gone nodes lead: a node that failed usually failed because of them, and its own notice
  // names them second-hand.
  std::string gone, failed;
  size_t unknown = 0;  // not asked: neither gone nor well as far as this node can tell
  for (const auto& [n, state] : states) {
    if (!state.asked && !state.failure) {
      ++unknown;
    } else if (state.asked && !state.answers) {
      gone += (gone.empty() ? "" : "; ") + describe_node(n) + " is gone (its daemon does not answer)";
    } else if (state.failure) {
      failed += (failed.empty() ? "" : "; ") + describe_node(n) + " failed: " + safe_text(*state.failure, 1000);
    }
  }
  const std::string prefix = "job " + options_.job_id + ": ";
  if (!gone.empty()) {
    // A node that does not answer is lost, whether this node's operation timed out on it or a
    // neighbour gave up first and closed its connections: one code for one cause.
    return Status(ErrorCode::kPeerLost, prefix + gone + (failed.empty() ? "" : "; " + failed) + " (" + error.message() + ")",
                  error.where());
  }
  if (!failed.empty()) return Status(error.code(), prefix + failed + " (" + error.message() + ")", error.where());
  if (unknown > 0) {
    return Status(error.code(),
                  prefix + std::to_string(unknown) + " other nodes were not asked (the probe's " +
                      std::to_string(kProbeTimeout.count()) + " ms passed first); the others answer: " +
                      error.message(),
                  error.where());
  }
  if (error.code() == ErrorCode::kTimeout) {
    // Every daemon answers and none reported a failure: a peer is alive but slow (its clients
    // are late, or it is still forming), not gone.
    return Status(ErrorCode::kTimeout,
                  prefix + "every other node's daemon answers, so a peer is slow, not gone: " + error.message(),
                  error.where());
  }
  return error;
}

void PeerCluster::publish_failure(const Status& status) {
  // Once this node has its generation, the other nodes of that generation must learn that it
  // gave up, formed or not: otherwise they would wait for it and call it slow.
  if (prefix_.empty()) return;
  // Our own rendezvous handle is cancelled by now (abort); the notice needs a fresh one.
  const Status sent = rendezvous_->fresh()->publish(
      options_.store_job, key("failure/" + std::to_string(options_.topology.node)), status.message(), kProbeTimeout);
  // Only a deadline that ran out: "unavailable" may be the channel's reconnect backoff, which
  // the leave's own call outlasts.
  rendezvous_unreachable_ = sent.code() == ErrorCode::kTimeout;
}

}  // namespace gradsync
