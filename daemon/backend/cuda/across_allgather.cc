// allgather across GPUs: rank by rank, in the same order on every node, a copy of the source's
// tensors into the bucket buffer of its GPU (on its node), a broadcast from there to every GPU,
// and a copy out into every local participant's output at the source's slot. Byte copies,
// through the one bucket buffer per GPU; the streams keep the steps in order. The skeleton's
// gather and scatter do nothing: the copies are part of the collective.
#include "daemon/backend/cuda/across.h"

namespace gradsync::cuda {
namespace {

class AllgatherAcross final : public AcrossPlanner {
 public:
  bool moves_bytes() const override { return true; }

  Launches launches(const AcrossBucket&, int) const override {
    Launches l;
    l.gather = false;
    l.scatter = false;
    l.bytes = true;
    return l;
  }

  std::vector<TableRequest> tables(const AcrossBucket& bucket, int device, AcrossSteps& steps) const override {
    const Topology& topology = *bucket.call->topology;
    std::vector<TableRequest> out;
    for (int source : topology.ranks(bucket.call->set->plan.buckets[bucket.call->bucket].group)) {
      const int local = source % topology.local_world_size;
      if (source / topology.local_world_size == topology.node &&
          steps.device_of_client(static_cast<uint32_t>(local)) == device) {
        out.push_back(TableRequest{Side::kGather, local, false, true});
      }
      out.push_back(TableRequest{Side::kScatterGathered, source, false, true});
    }
    return out;
  }

  Status collective(const AcrossBucket& bucket, std::span<const DeviceBuffer> buffers,
                    AcrossSteps& steps) const override {
    const Topology& topology = *bucket.call->topology;
    for (int source : topology.ranks(bucket.call->set->plan.buckets[bucket.call->bucket].group)) {
      const int node = source / topology.local_world_size;
      const int local = source % topology.local_world_size;
      const int source_rank = bucket.engine->rank_of(node, local);
      if (source_rank < 0) return Status::internal("rank " + std::to_string(source) + " has no GPU in the group");
      Status status;
      if (node == topology.node) {
        const int gpu = steps.device_of_client(static_cast<uint32_t>(local));
        status = steps.make_current(gpu);
        if (status.ok()) status = steps.gather_from(gpu, local);
      }
      if (status.ok()) status = bucket.engine->broadcast(buffers, bucket.bytes, source_rank);
      for (size_t i = 0; i < buffers.size() && status.ok(); ++i) {
        status = steps.make_current(buffers[i].device);
        if (status.ok()) status = steps.scatter_gathered(buffers[i].device, source);
      }
      if (!status.ok()) return status;
    }
    return Status();
  }
};

}  // namespace

const AcrossPlanner& allgather_across() {
  static const AllgatherAcross planner;  // stateless
  return planner;
}

}  // namespace gradsync::cuda
