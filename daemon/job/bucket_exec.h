// Executes one bucket of an operation across the local clients' memory, on the thread pool.
// Every function returns when the bucket's results are in every destination. The reduction
// order is fixed (local rank 0, 1, ...) and independent of the thread count, so results are
// bit-identical across clients and runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "daemon/job/tensor_set.h"
#include "daemon/reduce/kernel.h"
#include "daemon/util/thread_pool.h"

namespace gradsync {

// Results land in every client's tensors.
void execute_allreduce(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, ThreadPool& pool);

// Results land in the root's tensors only; the other clients' tensors are left as they were.
void execute_reduce(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, uint32_t root,
                    ThreadPool& pool);

// The root's tensors are copied into every other client's.
void execute_broadcast(const TensorSet& set, size_t bucket, uint32_t root, ThreadPool& pool);

// Every client's tensors are copied into every client's gather output, at the source's rank.
void execute_allgather(const TensorSet& set, size_t bucket, ThreadPool& pool);

}  // namespace gradsync
