#include "daemon/control/registration_check.h"

#include <algorithm>
#include <cstring>

#include "daemon/control/register_reply.h"
#include "daemon/plan/planner.h"
#include "shared/framing.h"
#include "shared/set_name.h"
#include "shared/dtype.h"
#include "shared/shard.h"

namespace gradsync {
namespace {

// Resolves one tensor descriptor against the client's segments. The range check is written so
// that no sum can overflow.
Status resolve_tensor(size_t index, const control::TensorDesc& desc, const Topology& topology,
                      const std::map<uint32_t, std::shared_ptr<const MemoryRegion>>& segments,
                      plan::TensorLayout* layout, std::byte** address, const MemoryRegion** segment) {
  const std::string name = "tensor " + std::to_string(index) + ": ";
  const auto dtype = dtype_from_raw(static_cast<uint32_t>(desc.dtype()));
  if (!dtype) return Status::invalid_argument(name + "unknown dtype " + std::to_string(desc.dtype()));
  auto it = segments.find(desc.segment_id());
  if (it == segments.end()) {
    return Status::invalid_argument(name + "unknown segment " + std::to_string(desc.segment_id()) +
                                    " (announce segments before registering tensors in them)");
  }
  const size_t element = dtype_size(*dtype);
  const uint64_t size = it->second->size();
  if (desc.numel() > size / element) {
    return Status::invalid_argument(name + std::to_string(desc.numel()) + " elements of " +
                                    std::string(dtype_name(*dtype)) + " do not fit in segment " +
                                    std::to_string(desc.segment_id()) + " of " + std::to_string(size) + " bytes");
  }
  const uint64_t bytes = desc.numel() * element;
  if (desc.offset() > size - bytes) {
    return Status::invalid_argument(name + "offset " + std::to_string(desc.offset()) + " + " + std::to_string(bytes) +
                                    " bytes is out of range for segment " + std::to_string(desc.segment_id()) +
                                    " of " + std::to_string(size) + " bytes");
  }
  if (desc.offset() % element != 0) {
    return Status::invalid_argument(name + "offset " + std::to_string(desc.offset()) +
                                    " is not a multiple of the " + std::string(dtype_name(*dtype)) +
                                    " element size " + std::to_string(element));
  }
  const std::string group = desc.group().empty() ? std::string(kDefaultGroup) : desc.group();
  if (!topology.has_group(group)) {
    return Status::invalid_argument(name + "process group '" + group +
                                    "' is not declared; declare it when joining (\"dp\" means all ranks)");
  }
  layout->dtype = *dtype;
  layout->numel = desc.numel();
  layout->group = group;
  *address = it->second->base() + desc.offset();
  *segment = it->second.get();
  return Status::ok_status();
}

}  // namespace

Status check_no_overlap(const std::vector<plan::TensorLayout>& layout, const std::vector<std::byte*>& address) {
  // Empty tensors own no bytes. Among the others, in address order, each must start at or
  // after the furthest end seen so far (not just its neighbour's: a short tensor between two
  // overlapping ones must not hide them).
  std::vector<size_t> order;
  order.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    if (layout[i].numel > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return address[a] < address[b]; });
  const std::byte* furthest_end = nullptr;
  size_t furthest = 0;
  for (size_t cur : order) {
    if (furthest_end != nullptr && address[cur] < furthest_end) {
      return Status::invalid_argument("tensor " + std::to_string(std::max(furthest, cur)) + " overlaps tensor " +
                                      std::to_string(std::min(furthest, cur)) + " in memory");
    }
    const std::byte* end = address[cur] + layout[cur].numel * dtype_size(layout[cur].dtype);
    if (furthest_end == nullptr || end > furthest_end) {
      furthest_end = end;
      furthest = cur;
    }
  }
  return Status::ok_status();
}

namespace {

// A reduce-scatter set is one flat range of one dtype split over one group (shared/shard.h);
// its output must hold the largest shard.
Status check_shard_output(const control::RegisterRequest& request, const Topology& topology,
                          const SegmentMap& segments, ResolvedSet* reg) {
  if (reg->layout.empty()) return Status::invalid_argument("reduce-scatter output: the set has no tensors");
  const plan::TensorLayout& first = reg->layout.front();
  uint64_t elements = 0;
  for (size_t i = 0; i < reg->layout.size(); ++i) {
    const plan::TensorLayout& t = reg->layout[i];
    if (t.dtype != first.dtype || t.group != first.group) {
      return Status::invalid_argument("reduce-scatter output: tensor " + std::to_string(i) + " is " +
                                      plan::describe(t) + " but tensor 0 is " + plan::describe(first) +
                                      "; a reduce-scatter set has one dtype and one process group");
    }
    elements += t.numel;
  }
  auto it = segments.find(request.shard_segment_id());
  if (it == segments.end()) {
    return Status::invalid_argument("reduce-scatter output: unknown segment " + std::to_string(request.shard_segment_id()));
  }
  const uint64_t bytes = shard_capacity(elements, topology.ranks(first.group).size()) * dtype_size(first.dtype);
  const uint64_t size = it->second->size();
  if (bytes > size || request.shard_offset() > size - bytes) {
    return Status::invalid_argument("reduce-scatter output: " + std::to_string(bytes) + " bytes at offset " +
                                    std::to_string(request.shard_offset()) + " do not fit in segment " +
                                    std::to_string(request.shard_segment_id()) + " of " + std::to_string(size) +
                                    " bytes");
  }
  if (request.shard_offset() % dtype_size(first.dtype) != 0) {
    return Status::invalid_argument("reduce-scatter output: offset " + std::to_string(request.shard_offset()) +
                                    " is not a multiple of the " + std::to_string(dtype_size(first.dtype)) +
                                    "-byte element size");
  }
  const std::byte* begin = it->second->base() + request.shard_offset();
  const std::byte* end = begin + bytes;
  for (size_t i = 0; i < reg->layout.size(); ++i) {
    const std::byte* t = reg->address[i];
    const std::byte* t_end = t + reg->layout[i].numel * dtype_size(reg->layout[i].dtype);
    // The output is written while other owners' pieces are still read from the tensors.
    if (t < end && begin < t_end) {
      return Status::invalid_argument("reduce-scatter output overlaps tensor " + std::to_string(i) + " in memory");
    }
  }
  reg->shard_output = it->second->base() + request.shard_offset();
  reg->used.push_back(it->second.get());
  return Status::ok_status();
}

// The mask: copied out of the client's segment first (the client may still write there), then
// checked, naming the first bad index.
Status read_mask(const control::RegisterRequest& request, const SegmentMap& segments, ResolvedSet* reg) {
  if (reg->shard_output != nullptr) {
    return Status::invalid_argument("mask: a masked set cannot have a reduce-scatter output (a shard of a masked "
                                    "range is not offered); register the two separately");
  }
  uint64_t elements = 0;
  for (const auto& t : reg->layout) elements += t.numel;
  const uint64_t count = request.mask_count();
  if (count == 0) {
    return Status::invalid_argument("mask: it keeps no element; register the set without a mask, or keep some");
  }
  if (count > elements) {
    return Status::invalid_argument("mask: " + std::to_string(count) + " indices for a set of " +
                                    std::to_string(elements) + " elements");
  }
  auto it = segments.find(request.mask_segment_id());
  if (it == segments.end()) {
    return Status::invalid_argument("mask: unknown segment " + std::to_string(request.mask_segment_id()));
  }
  if (it->second->kind() != MemoryKind::kHostMemfd) {
    return Status::invalid_argument("mask: segment " + std::to_string(request.mask_segment_id()) +
                                    " is not host memory; the indices are read by the daemon's CPU");
  }
  const uint64_t size = it->second->size();
  const uint64_t bytes = count * sizeof(uint64_t);
  if (request.mask_offset() > size || bytes > size - request.mask_offset() || request.mask_offset() % 8 != 0) {
    return Status::invalid_argument("mask: " + std::to_string(count) + " indices (" + std::to_string(bytes) +
                                    " bytes) at offset " + std::to_string(request.mask_offset()) +
                                    " do not fit, 8-byte aligned, in segment " +
                                    std::to_string(request.mask_segment_id()) + " of " + std::to_string(size) + " bytes");
  }
  auto mask = std::make_shared<std::vector<uint64_t>>(count);
  std::memcpy(mask->data(), it->second->base() + request.mask_offset(), bytes);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t index = (*mask)[i];
    if (index >= elements) {
      return Status::invalid_argument("mask: index " + std::to_string(i) + " is " + std::to_string(index) +
                                      ", past the set's " + std::to_string(elements) + " elements");
    }
    if (i > 0 && index <= (*mask)[i - 1]) {
      return Status::invalid_argument("mask: index " + std::to_string(i) + " (" + std::to_string(index) +
                                      ") does not follow index " + std::to_string(i - 1) + " (" +
                                      std::to_string((*mask)[i - 1]) +
                                      "); the indices must be strictly increasing");
    }
  }
  reg->mask = std::move(mask);
  return Status::ok_status();
}

}  // namespace

// Resolves and checks a whole registration against the client's segments (a snapshot: the
// client's next request waits for this one). Runs off the io thread.
Status check_registration(const control::RegisterRequest& request, const Topology& topology, int world_size,
                          const SegmentMap& segments, ResolvedSet* reg) {
  reg->set_id = request.set_id();
  if (Status label = check_set_label(request.label()); !label.ok()) {
    return Status::invalid_argument("set " + std::to_string(request.set_id()) + ": " + label.message());
  }
  reg->label = request.label();
  reg->bucket_cap = request.has_bucket_cap() ? request.bucket_cap_bytes() : plan::kDefaultBucketCapBytes;
  reg->layout.resize(static_cast<size_t>(request.tensors_size()));
  reg->address.resize(reg->layout.size());
  std::vector<const MemoryRegion*>& used = reg->used;
  for (size_t i = 0; i < reg->layout.size(); ++i) {
    const MemoryRegion* segment = nullptr;
    if (Status status = resolve_tensor(i, request.tensors(static_cast<int>(i)), topology, segments, &reg->layout[i],
                                       &reg->address[i], &segment);
        !status.ok()) {
      return status;
    }
    if (used.empty() || used.back() != segment) used.push_back(segment);
  }
  if (Status status = check_no_overlap(reg->layout, reg->address); !status.ok()) return status;
  // The reply names every bucket's tensors: it must fit in one frame, like the request.
  if (const size_t reply = register_reply_bound(plan::plan_buckets(reg->layout, plan::PlanOptions{reg->bucket_cap}));
      reply > kMaxFrameBytes) {
    return Status::resource_exhausted(
        "set " + std::to_string(request.set_id()) + ": its " + std::to_string(reg->layout.size()) +
        " tensors cut at a bucket cap of " + std::to_string(reg->bucket_cap) + " bytes would make a reply of " +
        std::to_string(reply) + " bytes, over the control protocol's frame limit of " + std::to_string(kMaxFrameBytes) +
        ": raise bucket_cap, or register fewer tensors per set");
  }
  if (request.has_gather_output()) {
    auto it = segments.find(request.gather_segment_id());
    if (it == segments.end()) {
      return Status::invalid_argument("allgather output: unknown segment " + std::to_string(request.gather_segment_id()));
    }
    uint64_t packed = 0;
    for (const auto& tensor : reg->layout) packed += tensor.numel * dtype_size(tensor.dtype);
    const uint64_t world = static_cast<uint64_t>(world_size);
    const uint64_t size = it->second->size();
    if (packed > size / world || request.gather_offset() > size - packed * world) {
      return Status::invalid_argument("allgather output: " + std::to_string(world) + " x " + std::to_string(packed) +
                                      " bytes at offset " + std::to_string(request.gather_offset()) +
                                      " do not fit in segment " + std::to_string(request.gather_segment_id()) +
                                      " of " + std::to_string(size) + " bytes");
    }
    reg->gather_output = it->second->base() + request.gather_offset();
    used.push_back(it->second.get());
  }
  if (request.has_shard_output()) {
    if (Status status = check_shard_output(request, topology, segments, reg); !status.ok()) return status;
  }
  if (request.has_mask()) {
    if (Status status = read_mask(request, segments, reg); !status.ok()) return status;
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  for (const auto& [id, segment] : segments) {
    if (std::binary_search(used.begin(), used.end(), segment.get())) reg->regions.push_back(segment);
  }
  return Status::ok_status();
}

}  // namespace gradsync
