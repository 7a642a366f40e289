// The host executor's cross-node path: one bucket whose process group spans nodes. The local
// participants are combined into a node buffer laid out in the bucket's canonical (planner)
// order, the engine runs the collective among the group's nodes, and the result fans back out
// to the local participants. Blocks the calling thread (the executor's own) until the bucket is
// done; every engine call in it is bounded by the engine's timeout or its abort().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/backend/executor.h"
#include "daemon/util/thread_pool.h"

namespace gradsync::host {

// Reused across buckets and steps; grows to the largest bucket and then stays. Shared with the
// engine calls that use it, which hold it until their library has left them (engine.h).
struct NodeBuffers {
  std::vector<std::byte> work;
  std::vector<std::byte> gathered;
  std::vector<std::byte> wire;  // wire compression: the node's sums as float16 or bfloat16
};

// Compares (sequence, operation, set, bucket) across the group's nodes and refuses to go on
// when they disagree, rather than mixing unrelated data.
Status check_sequence(const BucketCall& call, uint64_t integrity_every = 0);

// `buffers` is the caller's slot: when an engine call that was answered early (aborted) still
// holds the buffers in it, this bucket leaves them to that call and puts new ones in the slot.
// `integrity`: the silent-data-corruption check's setting (executor.h), applied to allreduce
// and reduce-scatter buckets.
Status execute_across_nodes(const BucketCall& call, ThreadPool& pool, std::shared_ptr<NodeBuffers>& buffers,
                            const IntegrityCheck& integrity = {});

}  // namespace gradsync::host
