// What an authenticated peer may do with a job's keys in the rendezvous store: the formation
// protocol's keys only, and each node's keys written only by the daemon that took that node.
// Being in the cluster (peer_auth.h) is not being in the job: a daemon of another job, or a
// stray client with the token, cannot replace a node's entry, a layout or a Gloo address, or
// move a counter beyond what formation does, in a job it does not take part in.
//
// A caller is a daemon instance for one job at one rendezvous: an id derived from a secret
// each gradsyncd makes at start (PeerAuth::instance_for), sent with every call about a job.
// The keys of a job (peer_cluster.cc, config_channel.cc):
//   incarnations          counter: every node adds 1 per incarnation (anyone in the cluster)
//   g<N>/node/<n>         node n's entry in generation N: the first daemon to set it takes
//                         node n of generation N; nobody else may set it afterwards. N may not
//                         run ahead of `incarnations`; where this daemon runs the job itself
//                         (the rendezvous is node 0), n must be one of its nodes and node 0 is
//                         this daemon's own.
//   g<N>/group/...        Gloo's keys for a group's mesh: any node of generation N, once each
//   g<N>/cfg/<k>          a settings change: any node of it, set-if-absent only
//   g<N>/cfg/count        counter: any node of it, by add only
//   g<N>/ended            counter: each node adds 1 once, when it leaves
//   g<N>/.../<n>          every other key ending in a node number (layouts, exchanges,
//                         failures, and table/0, node 0's table of every node's entry): node
//                         n's daemon only
// Reading a generation's keys takes a node of it; deleting them takes a node that has ended,
// once every node that took a place has. Counters move by 0 (a read) or 1, nothing else. The
// store records who took which node under reserved keys ("g<N>/~...") no caller may name;
// they go with the generation's keys.
//
// A node is held by the instance and the identity (kv_store.h StoreMember::identity: its
// certificate, or the node its token proofs declare) that took it: the same instance id
// calling as another identity is refused every key of the generation. The caller's address is
// not part of it, so a daemon reconnecting over another address keeps its place.
//
// Residual: with only a token, any cluster member can take a node of a job before its real
// daemon does (the real one is then refused, loudly), and add 1 to a job's `incarnations`.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "daemon/peer/kv_store.h"
#include "shared/status.h"

namespace gradsync {

class KeyScope {
 public:
  // What this daemon knows of a job it runs itself.
  struct LocalJob {
    int nodes = 0;
    std::string node0_instance;  // the instance id node 0 calls with, when this daemon is node 0
  };
  using JobLookup = std::function<std::optional<LocalJob>(const std::string& job)>;

  explicit KeyScope(KvStore* store, JobLookup lookup = {}) : store_(store), lookup_(std::move(lookup)) {}

  // Checks a set (`if_absent`: set-if-absent) by `instance`; setting g<N>/node/<n> takes the node.
  // `member`: who the scope's own bookkeeping keys (a claim, a membership, an end) are charged
  // to in the store (kv_store.h); empty: nobody.
  Status may_set(const std::string& job, const std::string& key, bool if_absent, const std::string& instance,
                 const StoreMember& member = {});
  // Checks an add; adding 1 to g<N>/ended records that `instance` ended.
  Status may_add(const std::string& job, const std::string& key, int64_t delta, const std::string& instance,
                 const StoreMember& member = {});
  // Undoes what may_add() recorded (an end's marker) when the add itself then failed.
  void undo_add(const std::string& job, const std::string& key, int64_t delta, const std::string& instance);
  Status may_get(const std::string& job, const std::vector<std::string>& keys, const std::string& instance,
                 const StoreMember& member = {});
  Status may_delete(const std::string& job, const std::string& prefix, const std::string& instance,
                    const StoreMember& member = {});

 private:
  Status claim(const std::string& job, const std::string& generation, uint64_t number, int node,
               const std::string& instance, const StoreMember& member);
  Status check_member(const std::string& job, const std::string& generation, const std::string& key,
                      const std::string& instance, const StoreMember& member);

  KvStore* store_;
  JobLookup lookup_;
};

}  // namespace gradsync
