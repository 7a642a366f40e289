#include "daemon/job/op.h"

namespace gradsync {

void trace_landed(Op& op, size_t clients, std::chrono::steady_clock::time_point launched,
                  std::chrono::steady_clock::time_point landed, const BucketTimings& timings) {
  if (op.traced.size() >= TraceLog::kMaxBuckets) {
    op.traced_left_out++;
    return;
  }
  const plan::Bucket& bucket = op.set->plan.buckets[op.next_bucket];
  BucketTrace traced;
  traced.index = static_cast<uint32_t>(op.next_bucket);
  traced.group = bucket.group;
  traced.bytes = bucket.bytes;
  const auto first = op.ready_at.begin() + static_cast<std::ptrdiff_t>(op.next_bucket * clients);
  traced.ready.assign(first, first + static_cast<std::ptrdiff_t>(clients));
  traced.launched = launched;
  traced.landed = landed;
  traced.parts = timings;
  op.traced.push_back(std::move(traced));
}

}  // namespace gradsync
