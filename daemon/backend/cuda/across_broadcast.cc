// broadcast across GPUs: the root's GPU copies the root's tensors into its bucket buffer (as
// bytes, so any payload survives, NaNs of the half types included), NCCL broadcasts that buffer
// to every GPU, and every GPU copies it out to its clients, skipping the root itself.
#include "daemon/backend/cuda/across.h"

namespace gradsync::cuda {
namespace {

class BroadcastAcross final : public AcrossPlanner {
 public:
  bool moves_bytes() const override { return true; }
  bool has_root() const override { return true; }

  Launches launches(const AcrossBucket& bucket, int device) const override {
    Launches l;
    l.bytes = true;
    l.gather = bucket.root_here && device == bucket.root_gpu;
    l.only = bucket.root_local;
    l.scatter_skips_root = bucket.root_here;
    return l;
  }

  Status collective(const AcrossBucket& bucket, std::span<const DeviceBuffer> buffers, AcrossSteps&) const override {
    return bucket.engine->broadcast(buffers, bucket.bytes, bucket.root_rank);
  }
};

}  // namespace

const AcrossPlanner& broadcast_across() {
  static const BroadcastAcross planner;  // stateless
  return planner;
}

}  // namespace gradsync::cuda
