// The client's side of its completion ring: drains the daemon's completion entries and answers
// Work handles, and turns the job's sticky error (DaemonRings) or a daemon that went away into
// failures of every pending operation, so a wait never outlives its timeout.
// Thread-safe: Work handles may be waited on from several threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "shared/channel_layout.h"
#include "shared/memfd.h"
#include "shared/status.h"
#include "shared/mutex.h"

namespace gradsync {

// The job's per-step memory as this client maps it (shared/channel_layout.h).
struct JobChannel {
  Mapping doorbell;      // read-write, shared with the job's other clients
  Mapping client_rings;  // read-write, this client's own
  Mapping daemon_rings;  // read-only: the daemon sealed it against writes

  DoorbellPage* doorbell_page() const { return reinterpret_cast<DoorbellPage*>(doorbell.data()); }
  ClientRings* client() const { return reinterpret_cast<ClientRings*>(client_rings.data()); }
  const DaemonRings* daemon() const { return reinterpret_cast<const DaemonRings*>(daemon_rings.data()); }
};

// What a completed operation returned besides its status: the fused health, for an allreduce
// that asked for it (ReduceOptions::health). Filled once, under the Completions' lock, before
// the operation counts as completed.
struct OpResult {
  bool has_health = false;
  bool found_inf = false;
  double sq_norm = 0;
};

class Completions {
 public:
  // `daemon_gone` is asked now and then while waiting; it returns why the daemon is gone, or ok
  // while it is there. It must never block. `aborted` (may be empty) says why this client
  // aborted (Client::abort), if it did: that, rather than the failure the daemon then posts
  // ("rank N disconnected"), is what the operations failed by it report. Never blocks.
  Completions(std::shared_ptr<JobChannel> channel, std::function<Status()> daemon_gone,
              std::function<std::optional<Status>()> aborted = {});

  // Records that operation `seq` was submitted and awaits a completion. Sequence numbers grow.
  // `latency_bound`: a small operation (kLatencyBoundBytes or less), which completes within
  // microseconds, so a wait for it polls longer before it sleeps.
  // `result`: where the operation's result goes (an operation that asked for one); the Work
  // holds it, and Completions lets go of it once the operation completed.
  void expect(uint64_t seq, bool latency_bound = false, std::shared_ptr<OpResult> result = nullptr);
  static constexpr uint64_t kLatencyBoundBytes = 64 << 10;

  // Operations submitted and not yet completed.
  size_t pending() const;

  // True once seq completed (success or failure); *status is its outcome.
  bool poll(uint64_t seq, Status* status);

  // Waits until seq completed or the deadline passed; returns whether it completed.
  bool wait(uint64_t seq, std::chrono::steady_clock::time_point deadline, Status* status);

  // Waits until fewer than `limit` operations are pending (flow control for the completion ring).
  void wait_below(size_t limit, std::chrono::steady_clock::time_point deadline);

  // The job's sticky error, ok while healthy.
  Status job_failure();
  // The job's sticky error, or why the daemon is gone; ok while both are fine. Never blocks.
  Status health();

 private:
  bool has_entries() const;
  void drain_locked() GS_REQUIRES(mutex_);
  void fail_all_locked(const Status& status) GS_REQUIRES(mutex_);
  Status outcome_locked(uint64_t seq) const GS_REQUIRES(mutex_);
  Status daemon_failure() const;
  // The failure to record: this client's abort, if it aborted, else `seen`.
  Status cause(Status seen) const;
  bool check_liveness_locked() GS_REQUIRES(mutex_);
  WakeRef completion_ready() const;

  std::shared_ptr<JobChannel> channel_;  // keeps the rings mapped while any Work lives
  std::function<Status()> daemon_gone_;
  std::function<std::optional<Status>()> aborted_;
  mutable Mutex mutex_;
  RingReader<CompletionRing> reader_ GS_GUARDED_BY(mutex_);
  std::set<uint64_t> pending_ GS_GUARDED_BY(mutex_);  // submitted, not yet completed
  std::set<uint64_t> latency_bound_ GS_GUARDED_BY(mutex_);  // the pending ones that are small
  std::map<uint64_t, std::shared_ptr<OpResult>> results_ GS_GUARDED_BY(mutex_);  // pending ones that want one
  // Operations complete in sequence order and the first error of a job sticks, so every
  // operation from the first failed one on failed with failure_, and every earlier one
  // succeeded: the outcome of any completed operation, however old, without a table.
  uint64_t first_failed_ GS_GUARDED_BY(mutex_) = UINT64_MAX;
  Status failure_ GS_GUARDED_BY(mutex_);
  std::atomic<bool> failed_{false};     // failure_ is set (read without the lock)
  std::chrono::steady_clock::time_point next_liveness_check_;
};

}  // namespace gradsync
