// Fused health on device sets (health_functor.h): per bucket and GPU, the table of health blocks
// the health kernel reads, made once and kept with the executor's other tables, and how its
// results reach the operation's host-side health blocks (reduce/health.h) after the GPU is
// through the bucket.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/backend/cuda/device_api.h"
#include "daemon/backend/cuda/health_functor.h"
#include "daemon/model/tensor_set.h"
#include "shared/status.h"

namespace gradsync::cuda {

// In device memory: the items (one per health block of the bucket's tensors, as local rank
// `reader` holds them) and the kernel's output, item by item; `global` maps each output to the
// set's health block (TensorSet::health_block).
struct HealthTableState {
  void* items = nullptr;
  void* out = nullptr;
  uint64_t item_count = 0;
  std::vector<uint64_t> global;

  HealthTable table() const {
    return HealthTable{static_cast<const HealthItem*>(items), item_count, static_cast<reduce::HealthBlock*>(out)};
  }
};

// Allocates and uploads the table in `stream`'s order. Device sets hold whole tensors per
// bucket, so every block starts at a multiple of kHealthBlockElements from its tensor's start.
Status make_health_table(DeviceApi* api, const TensorSet& set, size_t bucket, int device, uint32_t reader, void* stream,
                         HealthTableState* state);

// Once the stream is through the health kernel: its outputs into `health`, at their places.
Status collect_health(DeviceApi* api, int device, void* stream, const HealthTableState& state,
                      std::vector<reduce::HealthBlock>* health);

// Frees the table's device memory in the stream's order.
void free_health_table(DeviceApi* api, int device, void* stream, const HealthTableState& state);

}  // namespace gradsync::cuda
