// An operation of a job as the worker tracks it: what every local client asked for under one
// sequence number, and how far each bucket's readiness has come.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/job/trace.h"
#include "daemon/model/op_desc.h"
#include "daemon/model/tensor_set.h"
#include "daemon/reduce/health.h"
#include "shared/channel_layout.h"
#include "shared/status.h"

namespace gradsync {

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
  // Fused health (desc.health): the set's health blocks, which its buckets' executions fill
  // (each its own tensors' blocks) and complete() folds; shared with those executions.
  std::shared_ptr<std::vector<reduce::HealthBlock>> health;
  std::vector<BucketTrace> traced;  // buckets landed so far, for the trace (bounded)
  uint32_t traced_left_out = 0;
};

// The head bucket of `op` (op.next_bucket) landed: adds it to the operation's trace (at most
// TraceLog::kMaxBuckets, then only counted). `clients` is the local world size.
void trace_landed(Op& op, size_t clients, std::chrono::steady_clock::time_point launched,
                  std::chrono::steady_clock::time_point landed, const BucketTimings& timings);

}  // namespace gradsync
