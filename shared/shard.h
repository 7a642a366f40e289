// Reduce-scatter's layout, one definition for the client, the daemon and the tests: the ZeRO /
// distributed-optimizer split of a tensor set's flat element range. The set's tensors, in
// registration order, form one flat range of N elements (a reduce-scatter set has one dtype and
// one process group, so the range is well defined); the group's W ranks, in ascending rank
// order, each own a shard of ceil(N / W) elements, the last ones shorter. Rank r's shard is
// empty when r * ceil(N / W) >= N, which happens with N >= W too: 6 elements over 4 ranks are
// shards of 2, 2, 2 and 0 (ZeRO's padded partitioning).
#pragma once

#include <algorithm>
#include <cstdint>

namespace gradsync {

struct ShardRange {
  uint64_t first = 0;  // flat element index of the shard's first element
  uint64_t count = 0;
};

// Elements every shard has room for: ceil(elements / group_size). Zero for an empty set.
inline constexpr uint64_t shard_capacity(uint64_t elements, uint64_t group_size) {
  return group_size == 0 ? 0 : (elements + group_size - 1) / group_size;
}

// The shard of the rank at position `index` (0-based) among the group's sorted ranks.
inline constexpr ShardRange shard_of(uint64_t elements, uint64_t group_size, uint64_t index) {
  const uint64_t capacity = shard_capacity(elements, group_size);
  const uint64_t first = std::min(elements, index * capacity);
  return ShardRange{first, std::min(elements, first + capacity) - first};
}

}  // namespace gradsync
