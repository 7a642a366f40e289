// A registration checked against the client's own segments: every tensor's dtype, segment,
// range and alignment, its process group, no two tensors sharing bytes, and the allgather
// and reduce-scatter outputs' room, and the mask's indices. Runs off the io thread (client_handler.cc), and is what the request fuzzer
// drives (tests/fuzz/request_fuzzer.cc). The errors name the tensor and what is wrong.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "daemon/model/memory.h"
#include "daemon/model/topology.h"
#include "daemon/plan/layout.h"
#include "proto/control.pb.h"
#include "shared/status.h"

namespace gradsync {

using SegmentMap = std::map<uint32_t, std::shared_ptr<const MemoryRegion>>;

struct ResolvedSet {
  uint32_t set_id = 0;
  std::string label;  // RegisterRequest.label, checked for length
  uint64_t bucket_cap = 0;
  std::vector<plan::TensorLayout> layout;
  std::vector<std::byte*> address;  // by tensor
  std::byte* gather_output = nullptr;
  std::byte* shard_output = nullptr;
  // The mask's indices (RegisterRequest.has_mask), copied out of the client's segment and
  // checked: strictly increasing, within the set's elements. Null without a mask.
  std::shared_ptr<const std::vector<uint64_t>> mask;
  std::vector<std::shared_ptr<const MemoryRegion>> regions;  // the segments the set uses
  std::vector<const MemoryRegion*> used;                     // the same, sorted, unowned
};

Status check_registration(const control::RegisterRequest& request, const Topology& topology, int world_size,
                          const SegmentMap& segments, ResolvedSet* out);

// Two tensors of one set must not share bytes: the reduction writes each of them.
Status check_no_overlap(const std::vector<plan::TensorLayout>& layout, const std::vector<std::byte*>& address);

}  // namespace gradsync
