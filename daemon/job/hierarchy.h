// Executes one bucket of an operation whose process group spans nodes: the local participants
// are combined into a node buffer laid out in the bucket's canonical (planner) order, the
// engine runs the collective among the group's nodes, and the result fans back out to the
// local participants. Before each bucket the nodes exchange a header (sequence, operation, set,
// bucket) and refuse to go on when they disagree, rather than mixing unrelated data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/engine/engine.h"
#include "daemon/job/op.h"
#include "daemon/job/tensor_set.h"
#include "daemon/job/topology.h"
#include "daemon/reduce/kernel.h"
#include "daemon/util/thread_pool.h"

namespace gradsync {

// Reused across buckets and steps; grows to the largest bucket and then stays.
struct NodeBuffers {
  std::vector<std::byte> work;
  std::vector<std::byte> gathered;
};

struct CrossNodeBucket {
  const Op* op = nullptr;
  size_t bucket = 0;
  const Topology* topology = nullptr;
  CollectiveEngine* engine = nullptr;
  reduce::KernelArgs args;  // allreduce and reduce
  ThreadPool* pool = nullptr;
  NodeBuffers* buffers = nullptr;
};

// Compares (sequence, operation, set, bucket) across the group's nodes.
Status check_sequence(const CrossNodeBucket& call);

Status execute_across_nodes(const CrossNodeBucket& call);

}  // namespace gradsync
