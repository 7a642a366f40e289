// Daemon-wide counters that outlive the jobs they count, since gradsyncd started (Prometheus):
// how many jobs failed with each error code (gradsync_job_failures_total: jobs that ended with
// work pending, not the clean ends of jobs whose trainers left between steps), and the
// operations and bytes of jobs that have ended (the live jobs' own are added when scraped, for
// gradsync_daemon_operations_total, gradsync_daemon_reduced_bytes_total and
// gradsync_daemon_cross_node_bytes_total). Written on the io
// thread; read by the metrics thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "shared/status.h"

namespace gradsync {

class DaemonCounters {
 public:
  static constexpr size_t kCodes = static_cast<size_t>(ErrorCode::kResourceExhausted) + 1;
  void add(ErrorCode code) {
    const auto i = static_cast<size_t>(code);
    if (i < kCodes) counts_[i].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t count(ErrorCode code) const {
    const auto i = static_cast<size_t>(code);
    return i < kCodes ? counts_[i].load(std::memory_order_relaxed) : 0;
  }
  // A job that ended, with what it did (clean or failed).
  void add_ended(uint64_t operations, uint64_t bytes, uint64_t cross_node_bytes, bool failed) {
    ended_operations_.fetch_add(operations, std::memory_order_relaxed);
    ended_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    ended_cross_node_bytes_.fetch_add(cross_node_bytes, std::memory_order_relaxed);
    (failed ? failed_jobs_ : clean_jobs_).fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t ended_operations() const { return ended_operations_.load(std::memory_order_relaxed); }
  uint64_t ended_bytes() const { return ended_bytes_.load(std::memory_order_relaxed); }
  uint64_t ended_cross_node_bytes() const { return ended_cross_node_bytes_.load(std::memory_order_relaxed); }
  uint64_t clean_jobs() const { return clean_jobs_.load(std::memory_order_relaxed); }
  uint64_t failed_jobs() const { return failed_jobs_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kCodes> counts_{};
  std::atomic<uint64_t> ended_operations_{0}, ended_bytes_{0}, ended_cross_node_bytes_{0}, clean_jobs_{0},
      failed_jobs_{0};
};

}  // namespace gradsync
