#include "daemon/backend/cuda/health_table.h"

#include <algorithm>

namespace gradsync::cuda {

Status make_health_table(DeviceApi* api, const TensorSet& set, size_t bucket, int device, uint32_t reader, void* stream,
                         HealthTableState* state) {
  std::vector<HealthItem> items;
  HealthTableState made;
  for (uint32_t t : set.plan.buckets[bucket].tensors) {
    const uint64_t numel = set.layout[t].numel;
    const size_t size = dtype_size(set.layout[t].dtype);
    for (uint64_t first = 0, block = set.health_block[t]; first < numel; first += reduce::kHealthBlockElements, ++block) {
      items.push_back(HealthItem{set.address[reader][t] + first * size, items.size(),
                                 static_cast<uint32_t>(std::min<uint64_t>(reduce::kHealthBlockElements, numel - first))});
      made.global.push_back(block);
    }
  }
  made.item_count = items.size();
  Status status = api->allocate(device, std::max<size_t>(1, items.size()) * sizeof(HealthItem), stream, &made.items);
  if (status.ok()) {
    status = api->allocate(device, std::max<size_t>(1, items.size()) * sizeof(reduce::HealthBlock), stream, &made.out);
  }
  if (status.ok()) status = api->upload(device, made.items, items.data(), items.size() * sizeof(HealthItem), stream);
  if (!status.ok()) {
    free_health_table(api, device, stream, made);
    return status;
  }
  *state = std::move(made);
  return Status();
}

Status collect_health(DeviceApi* api, int device, void* stream, const HealthTableState& state,
                      std::vector<reduce::HealthBlock>* health) {
  std::vector<reduce::HealthBlock> blocks(state.item_count);
  if (Status s = api->download(device, blocks.data(), state.out, blocks.size() * sizeof(reduce::HealthBlock), stream);
      !s.ok()) {
    return Status(s.code(), "reading the bucket's health back: " + s.message(), s.where());
  }
  for (size_t i = 0; i < blocks.size(); ++i) (*health)[state.global[i]] = blocks[i];
  return Status();
}

void free_health_table(DeviceApi* api, int device, void* stream, const HealthTableState& state) {
  if (state.items) (void)api->free(device, state.items, stream);
  if (state.out) (void)api->free(device, state.out, stream);
}

}  // namespace gradsync::cuda
