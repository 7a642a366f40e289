#include "daemon/job/op_queue.h"

#include <algorithm>

namespace gradsync {

OpQueue::OpQueue(std::string job_id, const Topology* topology, JobStats* stats)
    : job_id_(std::move(job_id)),
      topology_(topology),
      stats_(stats),
      clients_(static_cast<size_t>(topology->local_world_size)) {}

Status OpQueue::submit(uint32_t local_rank, uint64_t seq, bool all_ready, const OpDesc& desc,
                       std::shared_ptr<const TensorSet> set) {
  const uint64_t index = seq - first_seq_;
  if (index == ops_.size()) {
    Op op;
    op.seq = seq;
    op.desc = desc;
    op.set = set;
    op.started = std::chrono::steady_clock::now();
    op.waiting_since = op.started;
    const size_t buckets = set->plan.buckets.size();
    op.submitted.assign(clients_, false);
    op.marked.assign(clients_, {});
    op.remaining.assign(clients_, {});
    op.clients_ready.assign(buckets, 0);
    op.first_ready.assign(buckets, {});
    op.ready_at.assign(buckets * clients_, {});
    ops_.push_back(std::move(op));
  }
  Op& op = ops_[index];
  if (!(op.desc == desc)) {
    uint32_t first = 0;
    while (first < op.submitted.size() && !op.submitted[first]) ++first;
    return Status::layout_mismatch("job " + job_id_ + ": operation " + std::to_string(op.seq) + " differs: " +
                                   who(first) + " submitted " + describe(op.desc, op.set.get()) + ", " +
                                   who(local_rank) + " submitted " + describe(desc, set.get()));
  }
  op.submitted[local_rank] = true;
  const auto& buckets = op.set->plan.buckets;
  if (all_ready) {
    op.remaining[local_rank].assign(buckets.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) note_ready(op, b, local_rank);
  } else {
    op.marked[local_rank].assign(op.set->layout.size(), false);
    op.remaining[local_rank].resize(buckets.size());
    for (size_t b = 0; b < buckets.size(); ++b) {
      op.remaining[local_rank][b] = static_cast<uint32_t>(buckets[b].tensors.size());
      if (buckets[b].tensors.empty()) note_ready(op, b, local_rank);
    }
  }
  return Status::ok_status();
}

Status OpQueue::mark_ready(uint32_t local_rank, uint64_t seq, uint32_t tensor) {
  // Built only for an error: this runs once per tensor per step.
  const auto prefix = [&] { return "job " + job_id_ + ": " + who(local_rank) + ": "; };
  if (seq < first_seq_ || seq - first_seq_ >= ops_.size()) {
    return Status::protocol(prefix() + "marked a tensor ready for operation " + std::to_string(seq) +
                            ", which is not pending");
  }
  Op& op = ops_[seq - first_seq_];
  if (!op.submitted[local_rank] || op.marked[local_rank].empty()) {
    return Status::protocol(prefix() + "marked a tensor ready for operation " + std::to_string(seq) +
                            ", which it did not submit with deferred readiness");
  }
  if (tensor >= op.set->layout.size()) {
    return Status::invalid_argument(prefix() + "tensor index " + std::to_string(tensor) + " is out of range; " +
                                    op.set->name() + " has " + std::to_string(op.set->layout.size()) + " tensors");
  }
  if (op.marked[local_rank][tensor]) {
    return Status::invalid_argument(prefix() + "tensor " + std::to_string(tensor) +
                                    " was marked ready twice in operation " + std::to_string(seq));
  }
  op.marked[local_rank][tensor] = true;
  const uint32_t bucket = op.set->plan.bucket_of_tensor[tensor];
  if (--op.remaining[local_rank][bucket] == 0) note_ready(op, bucket, local_rank);
  return Status::ok_status();
}

void OpQueue::note_ready(Op& op, size_t bucket, uint32_t local_rank) {
  op.clients_ready[bucket]++;
  const auto now = std::chrono::steady_clock::now();
  if (op.first_ready[bucket] == std::chrono::steady_clock::time_point{}) op.first_ready[bucket] = now;
  op.ready_at[bucket * clients_ + local_rank] = now;
  stats_->bucket_ready(static_cast<int>(local_rank), now - op.first_ready[bucket]);
}

void OpQueue::pop_front() {
  ops_.pop_front();
  first_seq_++;
  if (!ops_.empty()) ops_.front().waiting_since = std::chrono::steady_clock::now();
}

bool OpQueue::head_ready() const {
  const Op& op = ops_.front();
  if (op.next_bucket < op.set->plan.buckets.size()) return op.clients_ready[op.next_bucket] == clients_;
  // A set with no buckets left still needs every client's submission before it completes.
  return std::find(op.submitted.begin(), op.submitted.end(), false) == op.submitted.end();
}

Status OpQueue::head_timed_out(std::chrono::milliseconds timeout) const {
  const Op& op = ops_.front();
  std::string missing;
  for (uint32_t c = 0; c < clients_; ++c) {
    const bool late =
        !op.submitted[c] || (op.next_bucket < op.remaining[c].size() && op.remaining[c][op.next_bucket] != 0);
    if (late) missing += (missing.empty() ? "" : ", ") + who(c);
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                            op.waiting_since);
  return Status::timeout("job " + job_id_ + ": operation " + std::to_string(op.seq) + " (" +
                         describe(op.desc, op.set.get()) + ") waited " + std::to_string(waited.count()) +
                         " ms, over the job timeout of " + std::to_string(timeout.count()) + " ms, for " +
                         (missing.empty() ? "its last submissions" : missing) +
                         (op.next_bucket < op.set->plan.buckets.size()
                              ? " to make bucket " + std::to_string(op.next_bucket) + " ready"
                              : " to submit it"));
}

std::vector<PendingOperation> OpQueue::report(bool head_executing) const {
  std::vector<PendingOperation> out;
  const auto now = std::chrono::steady_clock::now();
  for (const Op& op : ops_) {
    PendingOperation pending;
    pending.seq = op.seq;
    pending.kind = describe(op.desc, op.set.get());
    pending.set = op.desc.set_id;
    pending.age = std::chrono::duration_cast<std::chrono::milliseconds>(now - op.started);
    for (size_t c = 0; c < op.submitted.size(); ++c) {
      if (!op.submitted[c]) pending.ranks_not_submitted.push_back(topology_->rank_of(static_cast<int>(c)));
    }
    if (op.set) {
      const auto& buckets = op.set->plan.buckets;
      const bool executing = head_executing && &op == &ops_.front();
      for (size_t b = op.next_bucket; b < buckets.size(); ++b) {
        PendingBucket bucket;
        bucket.bucket = static_cast<uint32_t>(b);
        bucket.group = buckets[b].group;
        bucket.bytes = buckets[b].bytes;
        bucket.launched = executing && b == op.next_bucket;
        if (!bucket.launched) {
          for (uint32_t c : op.set->participants[b]) {
            const bool ready = c < op.submitted.size() && op.submitted[c] && b < op.remaining[c].size() &&
                               op.remaining[c][b] == 0;
            if (!ready) bucket.ranks_not_ready.push_back(topology_->rank_of(static_cast<int>(c)));
          }
        }
        pending.buckets.push_back(std::move(bucket));
      }
    }
    out.push_back(std::move(pending));
  }
  return out;
}

}  // namespace gradsync
