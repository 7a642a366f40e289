// The host executor's node-local path: one bucket of an operation within this node, across the
// local clients that take part in it (the members of the bucket's process group), on the pool. Every function returns
// when the bucket's results are in every destination. The reduction order is fixed (local rank
// 0, 1, ...) and independent of the thread count, so results are bit-identical across clients
// and runs. Buckets whose group spans nodes go through cross_node.h instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/model/tensor_set.h"
#include "daemon/reduce/kernel.h"
#include "daemon/util/thread_pool.h"

namespace gradsync::host {

// Below this many bytes a piece of work runs on one thread: waking helpers costs more than
// the work (the 4 KiB latency path). Used by the one-node and the cross-node execution.
inline constexpr uint64_t kMinBytesPerTask = 256 << 10;

// From this many bytes of results per output, results that go to memory the stage did not
// read are written with streaming stores (KernelArgs::stream_outputs): more than fits in a
// typical last-level cache beside everything else, so nobody would read them from the cache,
// and a normal store would first read every line it writes. Measured here, the 1-in-2-out
// fan-out of 100 MiB: 32-44 ms with normal stores, 30-36 ms streaming.
inline constexpr uint64_t kStreamResultsFromBytes = 16 << 20;

// A piece of one tensor of a bucket: elements [first, first + count) of tensor `tensor`.
struct TensorPiece {
  uint32_t tensor = 0;
  uint64_t first = 0;
  uint64_t count = 0;
};

// The bucket's tensors cut into pieces that `threads` threads share (none below
// kMinBytesPerTask unless a tensor is), each starting at a health block of its tensor
// (reduce/health.h), so that any of them can compute the fused health.
std::vector<TensorPiece> tensor_pieces(const TensorSet& set, size_t bucket, size_t threads);

// Results land in every client's tensors. `health`, when given, is the set's health blocks
// (TensorSet::health_block), of which the bucket's tensors' are filled in.
void execute_allreduce(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, ThreadPool& pool,
                       reduce::HealthBlock* health = nullptr);

// Results land in the root's tensors only (root is a local rank); the other clients' tensors are
// left as they were.
void execute_reduce(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, uint32_t root,
                    ThreadPool& pool);

// A piece of one participant's shard (reduce-scatter), a unit of work for the pool.
struct ShardTask {
  uint32_t owner = 0;  // local rank
  ShardPiece piece;
};

// Every participant's pieces of its shard in `bucket`, cut so that `threads` threads share them
// (none below kMinBytesPerTask unless a piece is): the work of a reduce-scatter's last stage.
std::vector<ShardTask> shard_tasks(const TensorSet& set, size_t bucket, size_t threads);

// Each participant's shard of the reduced bucket (TensorSet::shard_pieces) lands in its shard
// output; every element is reduced once, for its owner, and the tensors are left as they were.
void execute_reduce_scatter(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, ThreadPool& pool);

// The root's tensors (root is a local rank) are copied into every other participant's.
void execute_broadcast(const TensorSet& set, size_t bucket, uint32_t root, ThreadPool& pool);

// Every participant's tensors are copied into every participant's gather output, at the
// source's global rank (rank_base + local rank).
void execute_allgather(const TensorSet& set, size_t bucket, int rank_base, ThreadPool& pool);

}  // namespace gradsync::host
