// reduce across GPUs: every GPU gathers its clients' tensors into its bucket buffer, NCCL
// reduces the buffers onto the root's GPU, and only that GPU scatters, to the root alone.
#include "daemon/backend/cuda/across.h"

namespace gradsync::cuda {
namespace {

class ReduceAcross final : public AcrossPlanner {
 public:
  bool has_root() const override { return true; }

  Launches launches(const AcrossBucket& bucket, int device) const override {
    Launches l;
    l.scatter = bucket.root_here && device == bucket.root_gpu;
    l.scatter_only = bucket.root_local;
    return l;
  }

  Status collective(const AcrossBucket& bucket, std::span<const DeviceBuffer> buffers, AcrossSteps&) const override {
    const ReduceSpec spec{.op = bucket.args.combine, .element = bucket.dtype,
                          .wide_accumulate = bucket.args.wide_accumulate, .wire = bucket.wire};
    return bucket.engine->reduce(buffers, bucket.count, spec, bucket.root_rank);
  }
};

}  // namespace

const AcrossPlanner& reduce_across() {
  static const ReduceAcross planner;  // stateless
  return planner;
}

}  // namespace gradsync::cuda
