#include "daemon/plan/planner.h"

#include <cstddef>
#include <functional>
#include <string_view>
#include <unordered_map>

namespace gradsync::plan {
namespace {

// Views into the caller's TensorLayout::group strings; they outlive the planning call.
struct BucketKey {
  std::string_view group;
  DType dtype;

  bool operator==(const BucketKey&) const = default;
};

// Only for the in-process map below; nothing derived from it leaves plan_buckets, so the
// unstable std::hash is fine here (unlike in fingerprint()).
struct BucketKeyHash {
  size_t operator()(const BucketKey& key) const {
    const size_t group_hash = std::hash<std::string_view>{}(key.group);
    const size_t dtype_hash = std::hash<uint32_t>{}(static_cast<uint32_t>(key.dtype));
    // boost::hash_combine's mixing step.
    return group_hash ^ (dtype_hash + 0x9e3779b9u + (group_hash << 6) + (group_hash >> 2));
  }
};

// Whether `tensor_bytes` fits in a bucket already holding `bucket_bytes`, written so that it
// cannot overflow. A bucket that already exceeds the cap (one oversized tensor) takes nothing
// more, not even a zero-element tensor, so an oversized tensor always stays alone.
bool fits(uint64_t bucket_bytes, uint64_t tensor_bytes, uint64_t cap_bytes) {
  if (cap_bytes == 0) return true;
  if (bucket_bytes > cap_bytes) return false;
  return tensor_bytes <= cap_bytes - bucket_bytes;
}

}  // namespace

// Preconditions (checked at registration, not here): fewer than 2^32 tensors, and every
// tensor's numel * dtype_size, and the sum over all tensors, fit in 64 bits.
Plan plan_buckets(std::span<const TensorLayout> tensors, const PlanOptions& options) {
  Plan plan;
  plan.bucket_of_tensor.resize(tensors.size());

  // The one open bucket of each key; opening a new one closes the previous one for good.
  std::unordered_map<BucketKey, uint32_t, BucketKeyHash> open_bucket;

  for (size_t i = tensors.size(); i-- > 0;) {
    const TensorLayout& tensor = tensors[i];
    const uint64_t bytes = tensor.numel * dtype_size(tensor.dtype);
    const BucketKey key{tensor.group, tensor.dtype};

    auto it = open_bucket.find(key);
    uint32_t bucket_index = 0;
    if (it != open_bucket.end() &&
        fits(plan.buckets[it->second].bytes, bytes, options.cap_bytes)) {
      bucket_index = it->second;
    } else {
      bucket_index = static_cast<uint32_t>(plan.buckets.size());
      Bucket& opened = plan.buckets.emplace_back();
      opened.group = tensor.group;
      opened.dtype = tensor.dtype;
      open_bucket.insert_or_assign(key, bucket_index);
    }

    Bucket& bucket = plan.buckets[bucket_index];
    bucket.tensors.push_back(static_cast<uint32_t>(i));
    bucket.bytes += bytes;
    plan.bucket_of_tensor[i] = bucket_index;
  }

  return plan;
}

}  // namespace gradsync::plan
