// An operation of a job as the worker tracks it: what every local client asked for under one
// sequence number, and how far each bucket's readiness has come.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/job/tensor_set.h"
#include "daemon/job/topology.h"
#include "daemon/job/trace.h"
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

  bool operator==(const OpDesc&) const = default;
};

// "allreduce(avg, divide after) on set 0", "broadcast(root 2) on DDP bucket 3 (set 1)": the
// set named by its label when `set` is given (TensorSet::name()).
std::string describe(const OpDesc& desc, const TensorSet* set = nullptr);

// Validates a submission entry copied out of a ring and turns it into an OpDesc; the error
// names what was wrong ("unknown operation 9", "root 5 is outside world size 4").
Status parse_op(const SubmitEntry& entry, int world_size, OpDesc* desc);

// The reduction kernel's arguments for `desc` on a bucket of `dtype` whose group has
// `group_size` ranks (avg divides by the group unless the operation names a divisor).
reduce::KernelArgs kernel_args(const OpDesc& desc, DType dtype, int group_size);

// Whether `desc` can run on `set` in `topology`: an allgather needs the set's gather output,
// a reduction a kernel for every bucket's dtype, a rooted operation a root in every bucket's
// group. The error names what was wrong, without the caller's prefix.
Status check_op(const OpDesc& desc, const TensorSet& set, const Topology& topology);

// "rank 5 (local rank 1)", for messages.
std::string local_rank_name(const Topology& topology, uint32_t local_rank);

struct Op {
  uint64_t seq = 0;
  OpDesc desc;
  std::shared_ptr<const TensorSet> set;
  std::chrono::steady_clock::time_point started;  // first submission
  // Since when the worker waits for this operation's next bucket: the later of its first
  // submission, its becoming the head operation, and its last bucket's completion. The job
  // timeout runs from here.
  std::chrono::steady_clock::time_point waiting_since;
  std::vector<bool> submitted;                    // per local rank
  std::vector<std::vector<bool>> marked;          // [local rank][tensor]; deferred readiness
  std::vector<std::vector<uint32_t>> remaining;   // [local rank][bucket] tensors not yet ready
  std::vector<uint32_t> clients_ready;            // [bucket] local ranks whose bucket is ready
  // [bucket] when its first local rank made it ready (default: none yet), for readiness lag.
  std::vector<std::chrono::steady_clock::time_point> first_ready;
  size_t next_bucket = 0;                         // buckets launch strictly in index order
  // The worker applied the job's settings to it (and re-planned its set if the bucket cap
  // changed); it may launch buckets. Set just before its first bucket launches.
  bool begun = false;
  // [bucket * local ranks + local rank]: when that rank made the bucket ready (for the trace).
  std::vector<std::chrono::steady_clock::time_point> ready_at;
  std::vector<BucketTrace> traced;  // buckets landed so far, for the trace (bounded)
  uint32_t traced_left_out = 0;
};

// The head bucket of `op` (op.next_bucket) landed: adds it to the operation's trace (at most
// TraceLog::kMaxBuckets, then only counted). `clients` is the local world size.
void trace_landed(Op& op, size_t clients, std::chrono::steady_clock::time_point launched,
                  std::chrono::steady_clock::time_point landed, const BucketTimings& timings);

}  // namespace gradsync
