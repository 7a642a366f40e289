// Cuts a bucket's segments into the work items of one batched launch (functors.h). Done once per
// bucket when a set is registered; the table then lives on the device for every step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "daemon/backend/cuda/functors.h"

namespace gradsync::cuda {

inline std::vector<WorkItem> cut_into_items(std::span<const Segment> segments, uint64_t item_elements = kItemElements) {
  std::vector<WorkItem> items;
  for (uint32_t s = 0; s < segments.size(); ++s) {
    for (uint64_t first = 0; first < segments[s].count; first += item_elements) {
      items.push_back(WorkItem{s, first, std::min(item_elements, segments[s].count - first)});
    }
  }
  return items;
}

}  // namespace gradsync::cuda
