// Moving an operation that has not begun onto a set re-planned for a new bucket cap (a settings
// change, settings_schedule.h). Host sets only: a device set keeps the plan it was admitted
// with, because its executor prepared per-bucket state (NCCL registrations, staging) for it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "daemon/job/op.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"

namespace gradsync {

// The re-planned copies of a job's sets, one per set, made once per (set, cap) and kept while
// operations use them. They hold the clients' mappings too: clear() them when the job stops.
// Worker thread only.
class ReplanCache {
 public:
  // `original` (the set as registered) planned with bucket cap `cap`.
  std::shared_ptr<const TensorSet> get(const std::shared_ptr<const TensorSet>& original, uint64_t cap,
                                       const Topology& topology);
  void clear() { sets_.clear(); }

 private:
  struct Entry {
    std::shared_ptr<const TensorSet> from;
    uint64_t cap = 0;
    std::shared_ptr<const TensorSet> set;
  };
  std::map<uint32_t, Entry> sets_;  // by set id
};

// Moves `op`, none of whose buckets has launched, onto `set`, carrying the readiness its local
// ranks marked: a bucket of the new plan is ready for a rank when each of its tensors is (every
// tensor, for a rank that submitted with everything ready). `clients` is the local world size.
void rebind(Op& op, std::shared_ptr<const TensorSet> set, size_t clients);

}  // namespace gradsync
