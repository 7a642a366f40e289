// The bucket a job's worker handed to an executor and has not had answered: one at a time. The
// executor answers on any thread, possibly before launch() returns, possibly from inside an
// abort() that the job's fail() makes under the worker's lock: so the answer is kept under a
// lock of its own, and the worker is woken through its doorbell to take it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "daemon/backend/executor.h"
#include "daemon/backend/timings.h"
#include "daemon/job/channel.h"
#include "daemon/util/log.h"
#include "shared/mutex.h"
#include "shared/status.h"

namespace gradsync {

class BucketFlight {
 public:
  struct Launch {
    uint64_t seq = 0;
    size_t bucket = 0;
    std::string group;
    bool cross_node = false;  // its collective spans nodes: the job timeout is added to its bound
    std::chrono::steady_clock::time_point launched;
  };

  // The executor's answer rings `doorbell`, which the worker sleeps on.
  explicit BucketFlight(std::shared_ptr<JobDoorbell> doorbell) : doorbell_(std::move(doorbell)) {}

  // The rest is for the worker thread, except the callback start() returns.

  // Starts the flight of `launch`: returns what the executor answers with. The executor's
  // account of where the time went goes to timings(), reset here.
  BucketDone start(Launch launch);
  bool active() const { return launch_.has_value(); }
  const Launch& current() const { return *launch_; }  // while active()
  // The answer came.
  bool landed() const { return has_landed_.load(); }
  // Takes the answer (landed() must be true) and ends the flight.
  Status take();
  const std::shared_ptr<BucketTimings>& timings() const { return timings_; }
  // The flight ran past its bound (execution, plus `job_timeout` across nodes): the error,
  // naming the bucket, `op` (described), the time and the bounds. `job` leads the message.
  Status overran(const std::string& job, const std::string& op, std::chrono::milliseconds execution,
                 std::chrono::milliseconds job_timeout) const;

  // The job stopped: waits until the executor, aborted, answers the bucket in flight (about a
  // second), logging every 2 s meanwhile, and ends the flight. At once when none is active.
  void wait(const Logger& log);

 private:
  std::shared_ptr<JobDoorbell> doorbell_;
  std::optional<Launch> launch_;
  std::shared_ptr<BucketTimings> timings_ = std::make_shared<BucketTimings>();
  Mutex mutex_;
  std::optional<Status> answer_ GS_GUARDED_BY(mutex_);
  std::atomic<bool> has_landed_{false};  // answer_ is set: read without the lock to poll
};

}  // namespace gradsync
