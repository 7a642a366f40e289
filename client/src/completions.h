// The client's side of the completion ring: drains the daemon's completion entries into a table
// that Work handles query, and turns the job's sticky error (channel header) or a closed control
// connection into failures of every pending operation, so a wait never outlives its timeout.
// Thread-safe: Work handles may be waited on from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "client/src/connection.h"
#include "shared/channel_layout.h"
#include "shared/shm_segment.h"
#include "shared/status.h"

namespace gradsync {

class Completions {
 public:
  Completions(std::shared_ptr<ShmSegment> channel, uint32_t local_rank, std::shared_ptr<Connection> connection);

  // Records that operation `seq` was submitted and awaits a completion.
  void expect(uint64_t seq);

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

 private:
  bool has_entries() const;
  void drain_locked();
  void fail_all_locked(const Status& status);
  bool check_liveness_locked();

  std::shared_ptr<ShmSegment> channel_;  // keeps the rings mapped while any Work lives
  ChannelHeader* header_;
  ClientChannel* mine_;
  std::shared_ptr<Connection> connection_;
  mutable std::mutex mutex_;
  RingReader<CompletionRing> reader_;      // guarded by mutex_
  std::map<uint64_t, Status> pending_;     // guarded by mutex_; submitted, not yet completed
  std::map<uint64_t, Status> done_;        // guarded by mutex_
  Status failure_;                         // guarded by mutex_
  std::chrono::steady_clock::time_point next_liveness_check_;
};

}  // namespace gradsync
