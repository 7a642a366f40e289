// What one operation of a job is, as every local client must submit it alike (OpDesc), and the
// checks and descriptions made of it: value types below job/, shared by the worker, the
// executors and the control plane.
#pragma once

#include <cstdint>
#include <string>

#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"
#include "daemon/reduce/kernel.h"
#include "shared/channel_layout.h"
#include "shared/status.h"

namespace gradsync {

// The part of a submission that must be identical across local clients.
struct OpDesc {
  OpKind kind = OpKind::kAllreduce;
  uint32_t set_id = 0;
  WireReduceOp reduce_op = WireReduceOp::kSum;
  WireScaling scaling = WireScaling::kAfter;
  int32_t root = 0;
  double divisor = 0;
  bool narrow_accumulate = false;
  bool health = false;  // fused gradient health (reduce/health.h): allreduce of floating sets
  // Wire compression: buckets (carried in float32) cross nodes as this half type (kFloat32: not
  // compressed).
  DType wire = DType::kFloat32;

  bool operator==(const OpDesc&) const = default;
};

// Whether the kind combines values (allreduce, reduce, reduce-scatter) and so takes the reduce
// options.
bool is_reduction(OpKind kind);

// "allreduce(avg, divide after) on set 0", "broadcast(root 2) on DDP bucket 3 (set 1)": the
// set named by its label when `set` is given (TensorSet::name()).
std::string describe(const OpDesc& desc, const TensorSet* set = nullptr);

// Validates a submission entry copied out of a ring and turns it into an OpDesc; the error
// names what was wrong ("unknown operation 9", "root 5 is outside world size 4").
Status parse_op(const SubmitEntry& entry, int world_size, OpDesc* desc);

// The reduction kernel's arguments for `desc` on a bucket of `dtype` whose group has
// `group_size` ranks (avg divides by the group unless the operation names a divisor).
reduce::KernelArgs kernel_args(const OpDesc& desc, DType dtype, int group_size);

// Whether `desc` can run on `set` in `topology`: an allgather needs the set's gather output, a
// reduce-scatter its shard output,
// a reduction a kernel for every bucket's dtype, a rooted operation a root in every bucket's
// group. The error names what was wrong, without the caller's prefix.
Status check_op(const OpDesc& desc, const TensorSet& set, const Topology& topology);

// "rank 5 (local rank 1)", for messages.
std::string local_rank_name(const Topology& topology, uint32_t local_rank);

}  // namespace gradsync
