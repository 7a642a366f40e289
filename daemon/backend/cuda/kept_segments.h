// Masked reduction on device sets (TensorSet::kept, seeds S09): a bucket's kept elements as the
// gather and scatter kernels' segments, so that the kernels move only them, into and out of a
// compact bucket buffer in kept order (the order every node's buffer has, which NCCL carries).
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/backend/cuda/functors.h"
#include "daemon/model/tensor_set.h"

namespace gradsync::cuda {

// One segment per maximal run of consecutive kept positions within one tensor of the bucket:
// bucket_offset is the run's first index in kept order (its place in the compact buffer),
// count its length, address[k] the run's first element in local rank clients[k].
std::vector<Segment> kept_segments(const TensorSet& set, size_t bucket, const std::vector<uint32_t>& clients);

}  // namespace gradsync::cuda
