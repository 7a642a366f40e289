// A job's recent operations, kept for the admin service's DumpTrace: for each of the last
// kCapacity operations, when it started and finished, when each local rank made each bucket
// ready, and when each bucket executed, with the parts its executor reported. The worker fills
// a record while the operation runs and hands it over when it completes; the admin thread turns
// the kept records into Chrome trace JSON (chrome_trace.h).
//
// Bounded: kCapacity operations, and the first kMaxBuckets buckets of each (a record says how
// many it left out): about 256 x 64 x (100 + 8 x ranks) bytes, 2.7 MiB for 8 local ranks,
// whatever the plan.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "daemon/backend/timings.h"
#include "shared/mutex.h"

namespace gradsync {

struct BucketTrace {
  uint32_t index = 0;
  std::string group;
  uint64_t bytes = 0;
  std::vector<std::chrono::steady_clock::time_point> ready;  // [local rank]; default: not a participant
  std::chrono::steady_clock::time_point launched, landed;
  BucketTimings parts;
};

struct OpTrace {
  uint64_t seq = 0;
  std::string kind;  // describe(OpDesc)
  uint32_t set = 0;
  std::chrono::steady_clock::time_point started, finished;
  std::vector<BucketTrace> buckets;  // in launch order
  uint32_t buckets_left_out = 0;
};

class TraceLog {
 public:
  static constexpr size_t kCapacity = 256;
  static constexpr size_t kMaxBuckets = 64;

  void add(OpTrace op);
  // The last `count` operations (every one kept when count is 0), oldest first.
  std::vector<OpTrace> last(size_t count) const;

 private:
  mutable Mutex mutex_;
  std::deque<OpTrace> ops_ GS_GUARDED_BY(mutex_);
};

}  // namespace gradsync
