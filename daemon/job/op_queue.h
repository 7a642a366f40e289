// The operations a job's local clients have submitted and the worker has not completed, in
// sequence order, and how far each bucket's readiness has come. It matches submissions: the
// n-th operation of every local client must be the same one (OpDesc and set), and a mismatch
// is an error naming both ranks and both operations. Worker thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "daemon/job/op.h"
#include "daemon/job/reports.h"
#include "daemon/job/stats.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"
#include "shared/channel_layout.h"
#include "shared/status.h"

namespace gradsync {

class OpQueue {
 public:
  // `topology` and `stats` outlive the queue; `stats` counts readiness lag.
  OpQueue(std::string job_id, const Topology* topology, JobStats* stats);

  // Whether operation `seq` is within CompletionRing::capacity of the oldest pending one: the
  // client library keeps no more outstanding, and a client running further ahead is broken
  // (it would otherwise grow the queue without bound).
  bool within_window(uint64_t seq) const { return seq - first_seq_ < CompletionRing::capacity; }

  // `local_rank` submitted operation `seq` (the next for it, already checked by the caller),
  // with all its tensors ready or with readiness to follow tensor by tensor.
  Status submit(uint32_t local_rank, uint64_t seq, bool all_ready, const OpDesc& desc,
                std::shared_ptr<const TensorSet> set);
  // `local_rank` marked tensor `tensor` of operation `seq` ready.
  Status mark_ready(uint32_t local_rank, uint64_t seq, uint32_t tensor);

  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  Op& front() { return ops_.front(); }
  const Op& front() const { return ops_.front(); }
  std::deque<Op>::const_iterator begin() const { return ops_.begin(); }
  std::deque<Op>::const_iterator end() const { return ops_.end(); }

  // The head operation completed: the next one's wait starts now.
  void pop_front();
  // The job stopped: nothing is pending any more.
  void clear() { ops_.clear(); }

  // Whether every local rank submitted the head operation and made its next bucket ready.
  bool head_ready() const;
  // The head operation waited longer than `timeout` since its waiting_since: the error, naming
  // the local ranks it waits for and for what.
  Status head_timed_out(std::chrono::milliseconds timeout) const;

  // The pending operations for GetInFlight; `head_executing`: the head's next bucket is in
  // flight (it counts as done only once it lands).
  std::vector<PendingOperation> report(bool head_executing) const;

 private:
  void note_ready(Op& op, size_t bucket, uint32_t local_rank);
  std::string who(uint32_t local_rank) const { return local_rank_name(*topology_, local_rank); }

  const std::string job_id_;
  const Topology* topology_;
  JobStats* stats_;
  const size_t clients_;
  std::deque<Op> ops_;      // ops_[i].seq == first_seq_ + i
  uint64_t first_seq_ = 1;
};

}  // namespace gradsync
