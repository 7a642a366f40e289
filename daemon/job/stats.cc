#include "daemon/job/stats.h"

namespace gradsync {

void Histogram::add(std::chrono::nanoseconds duration) {
  const double seconds = std::chrono::duration<double>(duration).count();
  size_t i = 0;
  while (i + 1 < kBoundsSeconds.size() && seconds > kBoundsSeconds[i]) ++i;
  ++counts_[i];
  ++count_;
  sum_ += seconds;
}

double Histogram::quantile_seconds(double q) const {
  if (count_ == 0) return 0;
  const auto wanted = static_cast<uint64_t>(q * static_cast<double>(count_) + 0.999999);
  uint64_t seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    seen += counts_[i];
    if (seen >= wanted) return kBoundsSeconds[i];
  }
  return kBoundsSeconds.back();
}

void JobStats::bucket_ready(int local_rank, std::chrono::nanoseconds lag) {
  MutexLock lock(mutex_);
  if (local_rank >= 0 && static_cast<size_t>(local_rank) < data_.readiness_lag.size()) {
    data_.readiness_lag[static_cast<size_t>(local_rank)].add(lag);
  }
}

void JobStats::bucket_launched(uint32_t bucket, std::chrono::nanoseconds waited) {
  MutexLock lock(mutex_);
  data_.waiting_for_ranks.add(waited);
  if (bucket < JobStatsSnapshot::kMaxBucketIndices) {
    BucketStatsSnapshot& b = data_.buckets_by_index[bucket];
    ++b.launches;
    b.waiting_for_ranks.add(waited);
  }
}

void JobStats::bucket_landed(uint32_t bucket, uint64_t bytes, std::chrono::nanoseconds executed,
                             const BucketTimings& parts) {
  MutexLock lock(mutex_);
  ++data_.buckets;
  data_.bytes += bytes;
  data_.executing.add(executed);
  if (parts.reported) {
    data_.local_reduction.add(parts.local);
    if (parts.cross_node) {
      data_.cross_node_bytes += parts.carried_bytes;
      data_.waiting_for_peers.add(parts.peers);
      data_.collective.add(parts.collective);
    }
  }
  if (bucket < JobStatsSnapshot::kMaxBucketIndices) {
    BucketStatsSnapshot& b = data_.buckets_by_index[bucket];
    b.bytes += bytes;
    b.executing.add(executed);
  }
}

void JobStats::operation_done(std::chrono::nanoseconds latency) {
  MutexLock lock(mutex_);
  ++data_.operations;
  data_.operation_latency.add(latency);
}

JobStatsSnapshot JobStats::snapshot() const {
  MutexLock lock(mutex_);
  return data_;
}

}  // namespace gradsync
