// Tensors in shared memory and registered tensor sets. The memory belongs to the Client that
// allocated it and stays valid as long as that Client lives.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shared/dtype.h"

namespace gradsync {

// A view of a tensor in memory the daemon can reach: host shared memory, or device memory
// (device() >= 0, data() is then a device address).
class SharedTensor {
 public:
  SharedTensor() = default;
  SharedTensor(DType dtype, uint64_t numel, std::string group, std::byte* data, uint32_t segment_id, uint64_t offset,
               int device = -1)
      : dtype_(dtype), numel_(numel), group_(std::move(group)), data_(data), segment_id_(segment_id), offset_(offset),
        device_(device) {}

  DType dtype() const { return dtype_; }
  uint64_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * dtype_size(dtype_); }
  const std::string& group() const { return group_; }
  std::byte* data() const { return data_; }

  // -1 for host memory, else the CUDA device ordinal (as this process sees it).
  int device() const { return device_; }

  // The elements as T; T must match dtype() in size (uint16_t for float16/bfloat16). Host
  // tensors only: a device tensor's data() is not host memory.
  template <class T>
  std::span<T> as() const {
    return {reinterpret_cast<T*>(data_), static_cast<size_t>(numel_)};
  }

  uint32_t segment_id() const { return segment_id_; }
  uint64_t offset() const { return offset_; }

 private:
  DType dtype_ = DType::kFloat32;
  uint64_t numel_ = 0;
  std::string group_ = "dp";
  std::byte* data_ = nullptr;
  uint32_t segment_id_ = 0;
  uint64_t offset_ = 0;
  int device_ = -1;
};

struct BucketInfo {
  DType dtype = DType::kFloat32;
  std::vector<uint32_t> tensors;  // indices into the set
  uint64_t bytes = 0;
  bool zero_copy = false;  // reduced in place, no coalescing copy
};

// A registered set of tensors. Sets get ids 0, 1, 2, ... in registration order, so every rank
// must register its sets in the same order.
class TensorSet {
 public:
  uint32_t id() const { return id_; }
  // RegisterOptions::label ("" when none was given).
  const std::string& label() const { return label_; }
  size_t size() const { return tensors_.size(); }
  const SharedTensor& tensor(size_t i) const { return tensors_.at(i); }
  const std::vector<SharedTensor>& tensors() const { return tensors_; }
  const std::vector<BucketInfo>& buckets() const { return buckets_; }

  // After allgather: tensor i as contributed by `rank`. Requires RegisterOptions::allgather.
  // For a set in device memory the outputs are device memory on the set's GPU. Throws once the
  // set is released (Client::release): its outputs then serve later sets, or are freed.
  SharedTensor gathered(int rank, size_t i) const;

  // After reduce_scatter: this rank's shard of the reduced set, as a 1-D tensor of the set's
  // dtype, and where it starts in the set's flat elements (shared/shard.h). Requires
  // RegisterOptions::reduce_scatter. Empty when this rank's shard starts past the set's end
  // (rank r with r * ceil(N / W) >= N, e.g. rank 3 of 4 for 6 elements), or when this rank is
  // not in the set's group. Throws once the set is released, as gathered() does.
  SharedTensor shard() const;
  uint64_t shard_first() const { return shard_first_; }

 private:
  friend class ClientImpl;
  uint32_t id_ = 0;
  std::string label_;
  std::vector<SharedTensor> tensors_;
  std::vector<BucketInfo> buckets_;
  std::byte* gather_base_ = nullptr;
  int gather_device_ = -1;  // the outputs' GPU for a device set; -1: host memory
  std::byte* shard_base_ = nullptr;  // the shard output; nullptr: none reserved
  uint32_t shard_segment_ = 0;
  uint64_t shard_first_ = 0;
  uint64_t shard_count_ = 0;
  uint64_t packed_bytes_ = 0;
  std::vector<uint64_t> packed_offset_;
  int world_size_ = 0;
  uint64_t incarnation_ = 0;  // which join of the client it belongs to
  // Set by Client::release, seen by every copy of the set: its outputs are no longer its own.
  std::shared_ptr<std::atomic<bool>> released_ = std::make_shared<std::atomic<bool>>(false);
  void check_outputs_kept() const;
};

}  // namespace gradsync
