// A job's running statistics for the admin service's GetStats: operations and bytes, latency
// histograms with estimated quantiles, the time split into waiting for the local ranks, waiting
// for the other nodes, local reduction and the collective across nodes, per bucket index as well
// as per job, and per-rank readiness lag (how long after the first local rank each rank made a
// bucket ready), so a straggler shows while the job runs. Written by the job's worker thread,
// read by admin threads: every method takes the one mutex, for a few additions per bucket.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "daemon/backend/timings.h"
#include "shared/mutex.h"

namespace gradsync {

// Counts of durations in fixed exponential buckets, 10 µs to 100 s.
class Histogram {
 public:
  static constexpr std::array<double, 16> kBoundsSeconds = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2,
                                                            0.1,  0.3,  1.0,  3.0,  10.0, 30.0, 100.0, 1e300};
  void add(std::chrono::nanoseconds duration);
  uint64_t count() const { return count_; }
  double sum_seconds() const { return sum_; }
  // Upper bound of the bucket holding the q-th quantile (0 < q <= 1); 0 when empty.
  double quantile_seconds(double q) const;
  const std::array<uint64_t, kBoundsSeconds.size()>& counts() const { return counts_; }

 private:
  std::array<uint64_t, kBoundsSeconds.size()> counts_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct BucketStatsSnapshot {
  uint64_t launches = 0;
  uint64_t bytes = 0;
  Histogram waiting_for_ranks;
  Histogram executing;
};

struct JobStatsSnapshot {
  uint64_t operations = 0;
  uint64_t buckets = 0;
  uint64_t bytes = 0;                 // bucket bytes reduced (one rank's share)
  // Payload bytes this node handed to cross-node collectives (BucketTimings::carried_bytes):
  // a masked set's kept elements only, half with wire compression.
  uint64_t cross_node_bytes = 0;
  Histogram operation_latency;        // first submission to completion
  Histogram waiting_for_ranks;        // per bucket: the previous step of the op to every local rank ready
  Histogram executing;                // per bucket: launch to landing (local reduce, cross-node, fan-out)
  // The parts of `executing` the executor reported (host buckets; device buckets report none).
  Histogram waiting_for_peers;        // cross-node buckets: until every node reached the bucket
  Histogram local_reduction;          // combining, scaling and fan-out on this node
  Histogram collective;               // cross-node buckets: the engine's collective
  std::vector<Histogram> readiness_lag;  // [local rank]
  // By bucket index, over every set of the job. Indices at or past kMaxBucketIndices are
  // counted in the job's totals only, which bounds the memory a huge plan can make this take.
  std::map<uint32_t, BucketStatsSnapshot> buckets_by_index;
  static constexpr uint32_t kMaxBucketIndices = 1024;
};

class JobStats {
 public:
  explicit JobStats(int local_ranks) { data_.readiness_lag.resize(static_cast<size_t>(local_ranks)); }
  void bucket_ready(int local_rank, std::chrono::nanoseconds lag);
  void bucket_launched(uint32_t bucket, std::chrono::nanoseconds waited);
  void bucket_landed(uint32_t bucket, uint64_t bytes, std::chrono::nanoseconds executed, const BucketTimings& parts);
  void operation_done(std::chrono::nanoseconds latency);
  JobStatsSnapshot snapshot() const;

 private:
  mutable Mutex mutex_;
  JobStatsSnapshot data_ GS_GUARDED_BY(mutex_);
};

}  // namespace gradsync
