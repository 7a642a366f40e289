// allreduce across GPUs: every GPU gathers its clients' tensors into its bucket buffer (in the
// accumulation type), NCCL all-reduces the buffers, and every GPU scatters the result (scaled,
// rounded) back. Zero-copy, when each GPU holds one client laid out as the bucket: NCCL reduces
// in the clients' own memory, and the kernels only scale, in place, before or after it.
#include "daemon/backend/cuda/across.h"

namespace gradsync::cuda {
namespace {

class AllreduceAcross final : public AcrossPlanner {
 public:
  bool zero_copy() const override { return true; }

  Launches launches(const AcrossBucket& bucket, int) const override {
    Launches l;
    if (bucket.direct) {
      l.gather = bucket.args.scale == reduce::Scale::kBefore;
      l.scatter = bucket.args.scale == reduce::Scale::kAfter;
    }
    return l;
  }

  Status collective(const AcrossBucket& bucket, std::span<const DeviceBuffer> buffers, AcrossSteps&) const override {
    const ReduceSpec spec{.op = bucket.args.combine, .element = bucket.dtype,
                          .wide_accumulate = bucket.args.wide_accumulate, .wire = bucket.wire};
    return bucket.engine->allreduce(buffers, bucket.count, spec);
  }
};

}  // namespace

const AcrossPlanner& allreduce_across() {
  static const AllreduceAcross planner;  // stateless
  return planner;
}

}  // namespace gradsync::cuda
