#include "daemon/job/replan.h"

#include <chrono>

namespace gradsync {

std::shared_ptr<const TensorSet> ReplanCache::get(const std::shared_ptr<const TensorSet>& original, uint64_t cap,
                                                  const Topology& topology) {
  Entry& cached = sets_[original->id];
  if (cached.from != original || cached.cap != cap || !cached.set) {
    auto copy = std::make_shared<TensorSet>(*original);
    copy->bucket_cap = cap;
    complete_tensor_set(copy.get(), topology);
    cached = Entry{original, cap, std::move(copy)};
  }
  return cached.set;
}

void rebind(Op& op, std::shared_ptr<const TensorSet> set, size_t clients) {
  op.set = std::move(set);
  const auto& plan = op.set->plan;
  const size_t buckets = plan.buckets.size();
  const auto now = std::chrono::steady_clock::now();
  op.clients_ready.assign(buckets, 0);
  op.first_ready.assign(buckets, {});
  op.ready_at.assign(buckets * clients, {});
  for (size_t c = 0; c < clients; ++c) {
    if (!op.submitted[c]) continue;
    op.remaining[c].assign(buckets, 0);
    if (!op.marked[c].empty()) {
      for (size_t t = 0; t < op.marked[c].size(); ++t) {
        if (!op.marked[c][t]) op.remaining[c][plan.bucket_of_tensor[t]]++;
      }
    }
    for (size_t b = 0; b < buckets; ++b) {
      if (op.remaining[c][b] != 0) continue;
      op.clients_ready[b]++;
      if (op.first_ready[b] == std::chrono::steady_clock::time_point{}) op.first_ready[b] = now;
      op.ready_at[b * clients + c] = now;
    }
  }
}

}  // namespace gradsync
