// What an authenticated peer may do with a job's keys in the rendezvous store: the formation
// protocol's keys only, and each node's keys written only by the daemon that took that node.
// Being in the cluster (peer_auth.h) is not being in the job: a daemon of another job, or a
// stray client with the token, cannot pre-seed a node's entry, replace a layout or a Gloo
// address, or poison a counter of a job it does not take part in.
//
// A caller is a daemon instance: a random id each gradsyncd makes at start and sends with
// every call (PeerAuth::instance). The keys of a job (peer_cluster.cc, config_channel.cc):
//   incarnations          counter: every node adds 1 per incarnation (anyone in the cluster)
//   g<N>/node/<n>         node n's entry in generation N: the first daemon to set it takes
//                         node n of generation N; nobody else may set it afterwards
//   g<N>/group/...        Gloo's own keys for a group's mesh: any node of generation N
//   g<N>/cfg/<k>          settings changes, and the counter g<N>/cfg/count: any node of it
//   g<N>/ended            counter: each node adds 1 when it leaves (any node of it)
//   g<N>/.../<n>          every other key ending in a node number (layouts, exchanges,
//                         failures): node n's daemon only
// Reading a generation's keys, or deleting them, takes a node of that generation too.
// Counters move by 0 (a read) or 1, nothing else. The store records who took which node under
// reserved keys ("g<N>/~...") no caller may name; they go with the generation's keys.
#pragma once

#include <string>
#include <vector>

#include "daemon/peer/kv_store.h"
#include "shared/status.h"

namespace gradsync {

class KeyScope {
 public:
  explicit KeyScope(KvStore* store) : store_(store) {}

  // Checks a set (or set-if-absent) by `instance`; setting g<N>/node/<n> takes the node.
  Status may_set(const std::string& job, const std::string& key, const std::string& instance);
  Status may_add(const std::string& job, const std::string& key, int64_t delta, const std::string& instance);
  Status may_get(const std::string& job, const std::vector<std::string>& keys, const std::string& instance);
  Status may_delete(const std::string& job, const std::string& prefix, const std::string& instance);

 private:
  // "g<N>/" of `key` and the rest, or false when the key is not in a generation.
  static bool split_generation(const std::string& key, std::string* generation, std::string* rest);
  Status check_member(const std::string& job, const std::string& generation, const std::string& key,
                      const std::string& instance);

  KvStore* store_;
};

}  // namespace gradsync
