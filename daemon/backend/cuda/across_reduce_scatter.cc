// reduce-scatter across GPUs: every GPU gathers its clients' tensors into its bucket buffer (in
// the accumulation type), the GPUs reduce the buffers, and every GPU scatters each of its
// clients' shard pieces (scaled, rounded) into that client's shard output (Side::kScatterShards).
//
// The reduction is NCCL's reduce-scatter when the bucket is the whole set and the engine's
// GPUs are the group's ranks in order, one rank per GPU: NCCL's rank r then owns elements
// [r * s, (r + 1) * s) of the buffer, which is exactly rank r's shard (shared/shard.h), and each
// GPU moves (W - 1) / W of the bucket instead of an allreduce's twice that. The buffer is
// padded to W * s elements; the padding's sums are never scattered. Otherwise (several buckets,
// or clients sharing a GPU) it is an allreduce, after which each GPU holds every shard.
#include "daemon/backend/cuda/across.h"

#include "daemon/reduce/staged.h"
#include "shared/shard.h"

namespace gradsync::cuda {
namespace {

// NCCL's reduce-scatter lays its chunks out as the set's shards.
bool native(const AcrossBucket& bucket) {
  const BucketCall& call = *bucket.call;
  const TensorSet& set = *call.set;
  const Topology& topology = *call.topology;
  if (set.bucket_elements[call.bucket] != set.flat_elements || set.flat_elements == 0) return false;
  const std::vector<int>& ranks = topology.ranks(set.plan.buckets[call.bucket].group);
  if (static_cast<size_t>(bucket.engine->ranks()) != ranks.size()) return false;
  for (size_t g = 0; g < ranks.size(); ++g) {
    const int r = ranks[g];
    if (bucket.engine->rank_of(r / topology.local_world_size, r % topology.local_world_size) != static_cast<int>(g)) {
      return false;
    }
  }
  return true;
}

class ReduceScatterAcross final : public AcrossPlanner {
 public:
  size_t buffer_elements(const AcrossBucket& bucket) const override {
    const TensorSet& set = *bucket.call->set;
    return native(bucket) ? set.shard_capacity * set.shard_group_size : bucket.count;
  }

  Launches launches(const AcrossBucket&, int) const override {
    Launches l;
    l.scatter_shards = true;
    return l;
  }

  Status collective(const AcrossBucket& bucket, std::span<const DeviceBuffer> buffers, AcrossSteps& steps) const override {
    const ReduceSpec spec{.op = bucket.args.combine, .element = bucket.dtype,
                          .wide_accumulate = bucket.args.wide_accumulate};
    if (!native(bucket)) return bucket.engine->allreduce(buffers, bucket.count, spec);
    // In place: rank r's result lands at its own chunk of its buffer. Each GPU holds one rank
    // here, so its rank is that of the local client on it.
    const BucketCall& call = *bucket.call;
    const TensorSet& set = *call.set;
    const size_t chunk_bytes = set.shard_capacity * dtype_size(reduce::accumulation_dtype(bucket.dtype));
    std::vector<DeviceBuffer> out(buffers.begin(), buffers.end());
    for (size_t i = 0; i < buffers.size(); ++i) {
      int rank = -1;
      for (uint32_t c : set.participants[call.bucket]) {
        if (steps.device_of_client(c) == buffers[i].device) {
          rank = bucket.engine->rank_of(call.topology->node, static_cast<int>(c));
        }
      }
      if (rank < 0) return Status::internal("reduce-scatter: GPU " + std::to_string(buffers[i].device) + " holds no rank");
      out[i].data = static_cast<std::byte*>(buffers[i].data) + static_cast<size_t>(rank) * chunk_bytes;
    }
    return bucket.engine->reduce_scatter(buffers, out, set.shard_capacity, spec);
  }
};

}  // namespace

const AcrossPlanner& reduce_scatter_across() {
  static const ReduceScatterAcross planner;  // stateless
  return planner;
}

}  // namespace gradsync::cuda
