#include "daemon/backend/host/local.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace gradsync::host {
namespace {

struct Chunk {
  size_t run = 0;
  uint64_t first = 0;  // element offset within the run
  uint64_t count = 0;
};

// Cuts the runs into about pool.size() chunks of similar size, none smaller than
// kMinBytesPerTask unless a run is.
std::vector<Chunk> split(const std::vector<BucketRun>& runs, size_t element, size_t parts) {
  uint64_t total = 0;
  for (const auto& run : runs) total += run.elements;
  const uint64_t min_elements = std::max<uint64_t>(1, kMinBytesPerTask / element);
  const uint64_t per_part = std::max(min_elements, (total + parts - 1) / std::max<size_t>(parts, 1));
  std::vector<Chunk> chunks;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (uint64_t first = 0; first < runs[r].elements; first += per_part) {
      chunks.push_back({r, first, std::min(per_part, runs[r].elements - first)});
    }
  }
  return chunks;
}

template <class Body>
void for_each_chunk(const TensorSet& set, size_t bucket, ThreadPool& pool, Body&& body) {
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  const auto& runs = set.runs[bucket];
  const std::vector<Chunk> chunks = split(runs, element, pool.size());
  pool.parallel_for(chunks.size(), [&](size_t i) {
    const Chunk& chunk = chunks[i];
    body(runs[chunk.run], chunk.first * element, chunk.count);
  });
}

}  // namespace

std::vector<TensorPiece> tensor_pieces(const TensorSet& set, size_t bucket, size_t threads) {
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  const uint64_t total = set.bucket_elements[bucket];
  const uint64_t share = std::max<uint64_t>(std::max<uint64_t>(1, kMinBytesPerTask / element),
                                            (total + threads - 1) / std::max<size_t>(threads, 1));
  const uint64_t block = reduce::kHealthBlockElements;
  const uint64_t per = (share + block - 1) / block * block;
  std::vector<TensorPiece> pieces;
  for (uint32_t t : set.plan.buckets[bucket].tensors) {
    for (uint64_t first = 0; first < set.layout[t].numel; first += per) {
      pieces.push_back({t, first, std::min(per, set.layout[t].numel - first)});
    }
  }
  return pieces;
}

void execute_allreduce(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, ThreadPool& pool,
                       reduce::HealthBlock* health) {
  const auto& members = set.participants[bucket];
  if (health) {
    // Tensor by tensor (the health's blocks are the tensors'), in place in every member.
    const size_t element = dtype_size(args.dtype);
    const std::vector<TensorPiece> pieces = tensor_pieces(set, bucket, pool.size());
    // Small tensors (biases, norms) share a task: one kernel call each, one task per
    // kMinBytesPerTask or so, as the run path would have merged them.
    std::vector<size_t> task_begin;
    uint64_t gathered = kMinBytesPerTask;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (gathered >= kMinBytesPerTask) {
        task_begin.push_back(i);
        gathered = 0;
      }
      gathered += pieces[i].count * element;
    }
    task_begin.push_back(pieces.size());
    pool.parallel_for(task_begin.size() - 1, [&](size_t task) {
      std::vector<const void*> inputs(members.size());
      std::vector<void*> outputs(members.size());
      for (size_t i = task_begin[task]; i < task_begin[task + 1]; ++i) {
        const TensorPiece& p = pieces[i];
        for (size_t k = 0; k < members.size(); ++k) {
          outputs[k] = set.address[members[k]][p.tensor] + p.first * element;
          inputs[k] = outputs[k];
        }
        reduce::KernelArgs piece = args;
        piece.health = health + set.health_block[p.tensor] + p.first / reduce::kHealthBlockElements;
        reduce::reduce(piece, inputs, outputs, p.count);
      }
    });
    return;
  }
  for_each_chunk(set, bucket, pool, [&](const BucketRun& run, uint64_t byte_offset, uint64_t count) {
    std::vector<const void*> inputs(members.size());
    std::vector<void*> outputs(members.size());
    for (size_t k = 0; k < members.size(); ++k) {
      outputs[k] = run.address[members[k]] + byte_offset;
      inputs[k] = outputs[k];
    }
    reduce::reduce(args, inputs, outputs, count);
  });
}

void execute_reduce(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, uint32_t root,
                    ThreadPool& pool) {
  const auto& members = set.participants[bucket];
  for_each_chunk(set, bucket, pool, [&](const BucketRun& run, uint64_t byte_offset, uint64_t count) {
    std::vector<const void*> inputs(members.size());
    for (size_t k = 0; k < members.size(); ++k) inputs[k] = run.address[members[k]] + byte_offset;
    void* output = run.address[root] + byte_offset;
    reduce::reduce(args, inputs, std::span<void* const>(&output, 1), count);
  });
}

std::vector<ShardTask> shard_tasks(const TensorSet& set, size_t bucket, size_t threads) {
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  // Pieces of about an equal share of the bucket each, so that every thread has work.
  const uint64_t per = std::max<uint64_t>(std::max<uint64_t>(1, kMinBytesPerTask / element),
                                          (set.bucket_elements[bucket] + threads - 1) / std::max<size_t>(threads, 1));
  std::vector<ShardTask> tasks;
  for (uint32_t owner : set.participants[bucket]) {
    for (const ShardPiece& whole : shard_pieces(set, bucket, owner)) {
      for (uint64_t done = 0; done < whole.count; done += per) {
        tasks.push_back({owner, ShardPiece{whole.tensor, whole.first + done, std::min(per, whole.count - done),
                                           whole.at + done}});
      }
    }
  }
  return tasks;
}

void execute_reduce_scatter(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, ThreadPool& pool) {
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  const auto& members = set.participants[bucket];
  const std::vector<ShardTask> tasks = shard_tasks(set, bucket, pool.size());
  pool.parallel_for(tasks.size(), [&](size_t i) {
    const ShardPiece& p = tasks[i].piece;
    std::vector<const void*> inputs;
    for (uint32_t m : members) inputs.push_back(set.address[m][p.tensor] + p.first * element);
    void* output = set.shard_output[tasks[i].owner] + p.at * element;
    reduce::reduce(args, inputs, std::span<void* const>(&output, 1), p.count);
  });
}

void execute_broadcast(const TensorSet& set, size_t bucket, uint32_t root, ThreadPool& pool) {
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  const auto& members = set.participants[bucket];
  for_each_chunk(set, bucket, pool, [&](const BucketRun& run, uint64_t byte_offset, uint64_t count) {
    for (uint32_t c : members) {
      if (c != root) std::memcpy(run.address[c] + byte_offset, run.address[root] + byte_offset, count * element);
    }
  });
}

void execute_allgather(const TensorSet& set, size_t bucket, int rank_base, ThreadPool& pool) {
  const plan::Bucket& b = set.plan.buckets[bucket];
  const size_t element = dtype_size(b.dtype);
  const auto& members = set.participants[bucket];
  // One task per (destination client, tensor); gathers are copies, bounded by memory bandwidth.
  pool.parallel_for(members.size() * b.tensors.size(), [&](size_t i) {
    const uint32_t dest = members[i / b.tensors.size()];
    const uint32_t t = b.tensors[i % b.tensors.size()];
    const size_t bytes = set.layout[t].numel * element;
    for (uint32_t source : members) {
      const uint64_t rank = static_cast<uint64_t>(rank_base) + source;
      std::memcpy(set.gather_output[dest] + rank * set.packed_bytes + set.packed_offset[t], set.address[source][t],
                  bytes);
    }
  });
}

}  // namespace gradsync::host
