// The bucket planner: groups a client's registered tensors into buckets, once, at registration.
//
// Rules (the seeds' _take_tensors; DDP's visit order):
//  - A bucket holds tensors of one key (group, dtype) only.
//  - Tensors are visited in reverse registration order, because gradients of the last layers
//    are ready first in backward. Bucket 0 holds the last-registered tensor.
//  - Buckets are numbered in the order they are opened in that visit, and every rank plans
//    the same layout identically, so bucket indices agree across ranks.
//  - A bucket never exceeds cap_bytes, except a single tensor larger than the cap, which gets
//    a bucket of its own. cap_bytes == 0 means no cap: one bucket per key (mmcv's
//    bucket_size_mb=-1).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shared/dtype.h"

namespace gradsync::plan {

// What must be identical across ranks for a tensor; where it lives may differ.
struct TensorLayout {
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
  std::string group;  // process-group name; "dp" means all ranks
};

struct Bucket {
  std::string group;
  DType dtype = DType::kFloat32;
  std::vector<uint32_t> tensors;  // registration indices, in the order they were added
  uint64_t bytes = 0;             // sum of the tensors' sizes
};

struct Plan {
  std::vector<Bucket> buckets;
  std::vector<uint32_t> bucket_of_tensor;  // indexed by registration index
};

inline constexpr uint64_t kDefaultBucketCapBytes = 25ull << 20;

struct PlanOptions {
  uint64_t cap_bytes = kDefaultBucketCapBytes;
};

Plan plan_buckets(std::span<const TensorLayout> tensors, const PlanOptions& options);

}  // namespace gradsync::plan
