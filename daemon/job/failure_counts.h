// How many jobs failed with each error code, daemon-wide, since it started (Prometheus'
// gradsync_job_failures_total): jobs that ended with work pending, not the clean ends of jobs
// whose trainers left between steps. Incremented on the io thread; read by the metrics thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "shared/status.h"

namespace gradsync {

class FailureCounts {
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

 private:
  std::array<std::atomic<uint64_t>, kCodes> counts_{};
};

}  // namespace gradsync
