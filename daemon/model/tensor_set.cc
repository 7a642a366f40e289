#include "daemon/model/tensor_set.h"

#include <algorithm>
#include <numeric>

#include "daemon/reduce/health.h"
#include "shared/dtype.h"

namespace gradsync {

void build_runs(TensorSet* set) {
  const size_t clients = set->address.size();
  set->runs.assign(set->plan.buckets.size(), {});
  set->offset_in_bucket.assign(set->layout.size(), 0);
  set->bucket_elements.assign(set->plan.buckets.size(), 0);
  set->canonical_run.assign(set->plan.buckets.size(), false);
  for (size_t b = 0; b < set->plan.buckets.size(); ++b) {
    const plan::Bucket& bucket = set->plan.buckets[b];
    std::vector<uint32_t> canonical = bucket.tensors;
    std::sort(canonical.begin(), canonical.end());
    for (uint32_t t : canonical) {
      set->offset_in_bucket[t] = set->bucket_elements[b];
      set->bucket_elements[b] += set->layout[t].numel;
    }
    const size_t element = dtype_size(bucket.dtype);
    // Walk the bucket's tensors in client 0's address order and merge neighbours that are
    // adjacent in every client. Element-wise operations do not care about the order of runs.
    std::vector<uint32_t> order = bucket.tensors;
    std::sort(order.begin(), order.end(),
              [&](uint32_t x, uint32_t y) { return set->address[0][x] < set->address[0][y]; });
    std::vector<BucketRun>& runs = set->runs[b];
    for (uint32_t t : order) {
      const uint64_t elements = set->layout[t].numel;
      if (elements == 0) continue;
      bool extends = !runs.empty();
      for (size_t c = 0; extends && c < clients; ++c) {
        extends = runs.back().address[c] + runs.back().elements * element == set->address[c][t];
      }
      if (extends) {
        runs.back().elements += elements;
        continue;
      }
      BucketRun run;
      run.elements = elements;
      for (size_t c = 0; c < clients; ++c) run.address.push_back(set->address[c][t]);
      runs.push_back(std::move(run));
    }
    if (runs.size() == 1) {
      bool canonical_here = true;
      for (size_t c = 0; c < clients && canonical_here; ++c) {
        for (uint32_t t : bucket.tensors) {
          canonical_here &= set->address[c][t] == runs[0].address[c] + set->offset_in_bucket[t] * element;
        }
      }
      set->canonical_run[b] = canonical_here;
    }
  }
}

namespace {

// Splits the mask (flat indices, checked at registration to be increasing and in range) by
// bucket, as canonical positions.
void build_kept(TensorSet* set) {
  set->kept.assign(set->plan.buckets.size(), {});
  if (!set->mask) return;
  std::vector<uint32_t> bucket_of(set->layout.size());
  for (uint32_t b = 0; b < set->plan.buckets.size(); ++b) {
    for (uint32_t t : set->plan.buckets[b].tensors) bucket_of[t] = b;
  }
  size_t t = 0;
  for (uint64_t flat : *set->mask) {
    while (flat >= set->flat_offset[t] + set->layout[t].numel) ++t;
    set->kept[bucket_of[t]].push_back(set->offset_in_bucket[t] + (flat - set->flat_offset[t]));
  }
  for (auto& kept : set->kept) {
    if (!std::is_sorted(kept.begin(), kept.end())) std::sort(kept.begin(), kept.end());
  }
}

}  // namespace

void complete_tensor_set(TensorSet* set, const Topology& topology) {
  set->plan = plan::plan_buckets(set->layout, plan::PlanOptions{set->bucket_cap});
  set->participants.clear();
  for (const auto& bucket : set->plan.buckets) {
    std::vector<uint32_t> members;
    for (int local : topology.local_members(bucket.group)) members.push_back(static_cast<uint32_t>(local));
    set->participants.push_back(std::move(members));
  }
  set->packed_offset.clear();
  uint64_t packed = 0;
  for (const auto& tensor : set->layout) {
    set->packed_offset.push_back(packed);
    packed += tensor.numel * dtype_size(tensor.dtype);
  }
  set->packed_bytes = packed;
  set->flat_offset.clear();
  uint64_t flat = 0;
  for (const auto& tensor : set->layout) {
    set->flat_offset.push_back(flat);
    flat += tensor.numel;
  }
  set->flat_elements = flat;
  set->health_block.clear();
  set->health_blocks = 0;
  for (const auto& tensor : set->layout) {
    set->health_block.push_back(set->health_blocks);
    set->health_blocks += (tensor.numel + reduce::kHealthBlockElements - 1) / reduce::kHealthBlockElements;
  }
  set->shard_index.assign(set->address.size(), -1);
  set->shard_capacity = 0;
  set->shard_group_size = 0;
  if (!set->shard_output.empty() && !set->layout.empty()) {
    const std::vector<int>& ranks = topology.ranks(set->layout[0].group);
    set->shard_group_size = ranks.size();
    set->shard_capacity = shard_capacity(flat, ranks.size());
    for (size_t c = 0; c < set->address.size(); ++c) {
      const auto at = std::find(ranks.begin(), ranks.end(), topology.rank_of(static_cast<int>(c)));
      if (at != ranks.end()) set->shard_index[c] = static_cast<int>(at - ranks.begin());
    }
  }
  build_runs(set);
  build_kept(set);
}

uint64_t mask_digest(const std::vector<uint64_t>& mask) {
  uint64_t hash = 14695981039346656037ull;
  for (uint64_t index : mask) {
    for (int byte = 0; byte < 8; ++byte) hash = (hash ^ ((index >> (8 * byte)) & 0xff)) * 1099511628211ull;
  }
  return hash;
}

std::vector<ShardPiece> shard_pieces(const TensorSet& set, size_t bucket, uint32_t local_rank) {
  std::vector<ShardPiece> pieces;
  const ShardRange shard = set.shard(local_rank);
  if (shard.count == 0) return pieces;
  std::vector<uint32_t> tensors = set.plan.buckets[bucket].tensors;
  std::sort(tensors.begin(), tensors.end());
  for (uint32_t t : tensors) {
    const uint64_t begin = std::max(set.flat_offset[t], shard.first);
    const uint64_t end = std::min(set.flat_offset[t] + set.layout[t].numel, shard.first + shard.count);
    if (begin < end) pieces.push_back({t, begin - set.flat_offset[t], end - begin, begin - shard.first});
  }
  return pieces;
}

std::vector<uint64_t> node_parts(const TensorSet& set, size_t bucket, const Topology& topology) {
  const std::string& group = set.plan.buckets[bucket].group;
  const std::vector<int>& ranks = topology.ranks(group);
  const std::vector<int> nodes = topology.nodes_of(group);
  std::vector<uint64_t> parts(nodes.size(), 0);
  const uint64_t capacity = shard_capacity(set.flat_elements, ranks.size());
  size_t at = 0;  // position in the group's sorted ranks
  for (size_t n = 0; n < nodes.size(); ++n) {
    // Ranks are node-major and the group's are sorted, so the node's ranks sit at consecutive
    // positions [lowest, at), and its shards span [first, end) of the flat range.
    const size_t lowest = at;
    while (at < ranks.size() && ranks[at] / topology.local_world_size == nodes[n]) ++at;
    const uint64_t first = std::min<uint64_t>(set.flat_elements, lowest * capacity);
    const uint64_t end = std::min<uint64_t>(set.flat_elements, at * capacity);
    for (uint32_t t : set.plan.buckets[bucket].tensors) {
      const uint64_t begin = std::max(set.flat_offset[t], first);
      const uint64_t stop = std::min(set.flat_offset[t] + set.layout[t].numel, end);
      if (begin < stop) parts[n] += stop - begin;
    }
  }
  return parts;
}

bool node_parts_even(const std::vector<uint64_t>& parts) {
  uint64_t total = 0, largest = 0;
  for (uint64_t p : parts) {
    total += p;
    largest = std::max(largest, p);
  }
  return parts.size() >= 2 && largest * parts.size() <= 2 * total;
}

ShardRange TensorSet::shard(uint32_t local_rank) const {
  if (local_rank >= shard_index.size() || shard_index[local_rank] < 0 || layout.empty()) return ShardRange{};
  return shard_of(flat_elements, shard_group_size, static_cast<uint64_t>(shard_index[local_rank]));
}

}  // namespace gradsync
