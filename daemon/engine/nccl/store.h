// How the daemons of one group agree on an NCCL communicator, in two exchanges through the job's
// Rendezvous (the peer service for a multi-node job):
//   1. "<name>/ranks": every node offers how many GPUs it brings and which of them each of its
//      local ranks uses. Ranks are node-major: node n's GPUs take ranks base(n) ... in the order
//      the node listed them, so every node computes the same map.
//   2. "<name>/id": the node that owns rank 0 offers a fresh NCCL unique id (ncclGetUniqueId
//      starts NCCL's bootstrap root in that daemon); the others offer nothing and read it.
// The values are short text, checked when read: a node that sends garbage is named.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "daemon/engine/nccl/api.h"
#include "daemon/engine/rendezvous.h"
#include "shared/status.h"

namespace gradsync::nccl {

struct RankPlan {
  int ranks = 0;                        // GPUs in the group, all nodes
  std::vector<int> base;                // [node]: the node's first rank
  std::vector<std::vector<int>> slot;   // [node][local rank]: GPU index on that node, or -1
  int node = 0;                         // this node

  // The rank of the GPU holding `local_rank` of `node`, or -1.
  int rank_of(int node, int local_rank) const;
  bool operator==(const RankPlan&) const = default;
};

// Exchange 1. `slots` holds, per local rank, the index into this node's `devices` GPUs, or -1.
Status plan_ranks(Rendezvous* rendezvous, const std::string& name, int devices, const std::vector<int>& slots,
                  RankPlan* plan);

// Between the two, "<name>/reuse": whether every node reuses communicators it kept from the
// job's previous generation (park.h). `offer` is this node's: empty when it brings no GPU,
// "fresh" when it has none to reuse, or reuse_offer() of what it kept. *reuse is true when every
// node that brings a GPU offered the same kept communicators; every node decides alike.
std::string reuse_offer(const UniqueId& id, uint64_t collectives);
Status agree_reuse(Rendezvous* rendezvous, const std::string& name, const std::string& offer, bool* reuse);

// Exchange 2. `make` is called on the node that owns rank 0 only.
Status agree_unique_id(Rendezvous* rendezvous, const std::string& name, const RankPlan& plan,
                       const std::function<Status(UniqueId*)>& make, UniqueId* id);

}  // namespace gradsync::nccl
