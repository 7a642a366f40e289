#include "daemon/backend/host/masked.h"

#include <algorithm>
#include <cstring>

#include "daemon/backend/host/local.h"
#include "daemon/reduce/simd.h"
#include "daemon/reduce/staged.h"

namespace gradsync::host {
namespace {

// Kept elements per task: large enough that a task's gathers outweigh waking a thread, small
// enough that every member's gathered copy of it stays in L2.
constexpr uint64_t kKeptPerTask = 16384;

// Where a kept element lives: element `element` of tensor `tensor`.
struct Location {
  uint32_t tensor = 0;
  uint64_t element = 0;
};

// The bucket's non-empty tensors in canonical order (TensorSet::offset_in_bucket: by tensor
// index, build_runs), with their offsets, which then strictly increase. Empty tensors are left
// out: one shares its successor's offset and would catch a position that is not its own.
struct CanonicalOrder {
  std::vector<uint64_t> offset;
  std::vector<uint32_t> tensor;
};

CanonicalOrder canonical_order(const TensorSet& set, size_t bucket) {
  std::vector<uint32_t> tensors = set.plan.buckets[bucket].tensors;
  std::sort(tensors.begin(), tensors.end());
  CanonicalOrder order;
  for (uint32_t t : tensors) {
    if (set.layout[t].numel == 0) continue;
    order.offset.push_back(set.offset_in_bucket[t]);
    order.tensor.push_back(t);
  }
  return order;
}

// The locations of kept positions [first, first + count) of the bucket (increasing).
void locate(const TensorSet& set, const CanonicalOrder& order, const uint64_t* kept, size_t count,
            std::vector<Location>* out) {
  out->resize(count);
  if (count == 0) return;
  // The last tensor starting at or before the first position (a kept position lies in one).
  size_t k = static_cast<size_t>(std::upper_bound(order.offset.begin(), order.offset.end(), kept[0]) -
                                 order.offset.begin()) - 1;
  for (size_t i = 0; i < count; ++i) {
    while (kept[i] >= order.offset[k] + set.layout[order.tensor[k]].numel) ++k;
    (*out)[i] = Location{order.tensor[k], kept[i] - order.offset[k]};
  }
}

// Element copies of a fixed size, so that each is one load or store.
template <size_t kSize>
void gather_as(const std::vector<std::byte*>& tensors, const std::vector<Location>& at, std::byte* out) {
  for (size_t i = 0; i < at.size(); ++i) std::memcpy(out + i * kSize, tensors[at[i].tensor] + at[i].element * kSize, kSize);
}

template <size_t kSize>
void scatter_as(const std::byte* in, const std::vector<Location>& at, const std::vector<std::byte*>& tensors) {
  for (size_t i = 0; i < at.size(); ++i) std::memcpy(tensors[at[i].tensor] + at[i].element * kSize, in + i * kSize, kSize);
}

void gather(size_t element, const std::vector<std::byte*>& tensors, const std::vector<Location>& at, std::byte* out) {
  switch (element) {
    case 1: return gather_as<1>(tensors, at, out);
    case 2: return gather_as<2>(tensors, at, out);
    case 4: return gather_as<4>(tensors, at, out);
    default: return gather_as<8>(tensors, at, out);
  }
}

void scatter(size_t element, const std::byte* in, const std::vector<Location>& at, const std::vector<std::byte*>& tensors) {
  switch (element) {
    case 1: return scatter_as<1>(in, at, tensors);
    case 2: return scatter_as<2>(in, at, tensors);
    case 4: return scatter_as<4>(in, at, tensors);
    default: return scatter_as<8>(in, at, tensors);
  }
}

size_t tasks_for(size_t kept) { return static_cast<size_t>((kept + kKeptPerTask - 1) / kKeptPerTask); }

// The health blocks of the bucket's tensors in `destination`, each from its stored results.
// Every block is written, so a block that kept nothing reads as the zeros it holds.
void masked_health(const TensorSet& set, size_t bucket, DType dtype, uint32_t destination, ThreadPool& pool,
                   reduce::HealthBlock* health) {
  struct Block {
    uint32_t tensor;
    uint64_t first;  // element
  };
  std::vector<Block> blocks;
  for (uint32_t t : set.plan.buckets[bucket].tensors) {
    for (uint64_t first = 0; first < set.layout[t].numel; first += reduce::kHealthBlockElements) {
      blocks.push_back(Block{t, first});
    }
  }
  // 16 blocks (256 KiB of float32) per task: reading them outweighs waking a thread.
  constexpr size_t kBlocksPerTask = 16;
  const size_t element = dtype_size(dtype);
  pool.parallel_for((blocks.size() + kBlocksPerTask - 1) / kBlocksPerTask, [&](size_t task) {
    const size_t end = std::min(blocks.size(), (task + 1) * kBlocksPerTask);
    for (size_t i = task * kBlocksPerTask; i < end; ++i) {
      const Block& b = blocks[i];
      const size_t count =
          static_cast<size_t>(std::min<uint64_t>(reduce::kHealthBlockElements, set.layout[b.tensor].numel - b.first));
      health[set.health_block[b.tensor] + b.first / reduce::kHealthBlockElements] =
          reduce::simd::health(dtype, set.address[destination][b.tensor] + b.first * element, count);
    }
  });
}

}  // namespace

void masked_accumulate(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, std::byte* acc,
                       ThreadPool& pool) {
  const std::vector<uint64_t>& kept = set.kept[bucket];
  const auto& members = set.participants[bucket];
  const size_t element = dtype_size(args.dtype);
  const size_t acc_size = dtype_size(reduce::accumulation_dtype(args.dtype));
  const CanonicalOrder order = canonical_order(set, bucket);
  pool.parallel_for(tasks_for(kept.size()), [&](size_t task) {
    const uint64_t first = task * kKeptPerTask;
    const size_t count = static_cast<size_t>(std::min<uint64_t>(kKeptPerTask, kept.size() - first));
    std::vector<Location> at;
    locate(set, order, kept.data() + first, count, &at);
    std::vector<std::byte> gathered(members.size() * count * element);
    std::vector<const void*> inputs;
    for (size_t k = 0; k < members.size(); ++k) {
      std::byte* into = gathered.data() + k * count * element;
      gather(element, set.address[members[k]], at, into);
      inputs.push_back(into);
    }
    reduce::accumulate(args, inputs, acc + first * acc_size, count);
  });
}

void masked_finish(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, const std::byte* acc,
                   const std::vector<uint32_t>& destinations, ThreadPool& pool, reduce::HealthBlock* health) {
  const std::vector<uint64_t>& kept = set.kept[bucket];
  const size_t element = dtype_size(args.dtype);
  const size_t acc_size = dtype_size(reduce::accumulation_dtype(args.dtype));
  // Zero the whole bucket first, then write the kept results over it: two passes over the kept
  // elements' lines, but every zeroing task is one long memset however the mask is spread.
  const std::vector<TensorPiece> pieces = tensor_pieces(set, bucket, pool.size());
  pool.parallel_for(pieces.size() * destinations.size(), [&](size_t i) {
    const TensorPiece& p = pieces[i % pieces.size()];
    std::memset(set.address[destinations[i / pieces.size()]][p.tensor] + p.first * element, 0, p.count * element);
  });
  const CanonicalOrder order = canonical_order(set, bucket);
  reduce::KernelArgs finishing = args;
  finishing.stream_outputs = false;
  finishing.health = nullptr;
  pool.parallel_for(tasks_for(kept.size()), [&](size_t task) {
    const uint64_t first = task * kKeptPerTask;
    const size_t count = static_cast<size_t>(std::min<uint64_t>(kKeptPerTask, kept.size() - first));
    std::vector<Location> at;
    locate(set, order, kept.data() + first, count, &at);
    std::vector<std::byte> results(count * element);
    void* out = results.data();
    reduce::finish(finishing, acc + first * acc_size, std::span<void* const>(&out, 1), count);
    for (uint32_t d : destinations) scatter(element, results.data(), at, set.address[d]);
  });
  if (health != nullptr && !destinations.empty()) masked_health(set, bucket, args.dtype, destinations[0], pool, health);
}

void execute_masked(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args,
                    const std::vector<uint32_t>& destinations, ThreadPool& pool, reduce::HealthBlock* health) {
  const size_t acc_size = dtype_size(reduce::accumulation_dtype(args.dtype));
  std::vector<std::byte> acc(set.kept[bucket].size() * acc_size);
  masked_accumulate(set, bucket, args, acc.data(), pool);
  masked_finish(set, bucket, args, acc.data(), destinations, pool, health);
}

}  // namespace gradsync::host
