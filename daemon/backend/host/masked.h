// Masked reduction (seeds S09, TensorSet::kept) on the host: only a bucket's kept elements are
// combined, and only they cross nodes. They are gathered from every member into one compact
// buffer of the accumulation dtype, in kept order (the same order on every node, which is what
// the engine carries); the finished results are scattered back, and every other element of the
// bucket in each destination becomes zero, as the seeds' `temp_zero[mask] = reduced` does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "daemon/model/tensor_set.h"
#include "daemon/reduce/kernel.h"
#include "daemon/util/thread_pool.h"

namespace gradsync::host {

// acc[i] = the members' element kept[bucket][i] combined in local rank order, with the
// prescale of Scale::kBefore and no post-divide (reduce::accumulate); acc holds the bucket's
// kept count of accumulation-dtype elements.
void masked_accumulate(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, std::byte* acc,
                       ThreadPool& pool);

// Every destination (local ranks) gets the finished acc[i] (reduce::finish) at its element
// kept[bucket][i] and zero at the bucket's other elements. `health` (an allreduce's fused
// health: the set's blocks, TensorSet::health_block), when given, gets the health of the
// bucket's tensors as the first destination now holds them: the masked results are scattered,
// not streamed through blocks, so this is a read pass over the bucket after the scatter, block
// by block as reduce/health.h defines (the zeros add nothing, so it is the same bits as the
// definition over the whole result).
void masked_finish(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args, const std::byte* acc,
                   const std::vector<uint32_t>& destinations, ThreadPool& pool, reduce::HealthBlock* health = nullptr);

// A bucket within this node: the participants' kept elements combined into every destination
// (allreduce: the participants; reduce: the root), the rest zeroed; `health` as masked_finish.
void execute_masked(const TensorSet& set, size_t bucket, const reduce::KernelArgs& args,
                    const std::vector<uint32_t>& destinations, ThreadPool& pool, reduce::HealthBlock* health = nullptr);

}  // namespace gradsync::host
