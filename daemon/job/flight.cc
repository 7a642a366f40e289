#include "daemon/job/flight.h"

namespace gradsync {
namespace {

// How often wait() looks again even without a wake-up, and how often it says it still waits.
constexpr auto kWaitSlice = std::chrono::milliseconds(200);
constexpr auto kWaitNote = std::chrono::seconds(2);

}  // namespace

BucketDone BucketFlight::start(Launch launch) {
  launch_ = std::move(launch);
  *timings_ = BucketTimings{};
  // Once has_landed_ is set the worker may finish and destroy this flight, so nothing of
  // `this` is touched after the lock is released: the notify happens under it, and take() and
  // wait() take the lock before going on.
  return [this, doorbell = doorbell_](const Status& answer) {
    MutexLock lock(mutex_);
    answer_ = answer;
    has_landed_.store(true);
    doorbell->page()->doorbell.notify();
  };
}

Status BucketFlight::take() {
  Status answer;
  {
    MutexLock lock(mutex_);
    answer = std::move(*answer_);
    answer_.reset();
    has_landed_.store(false);
  }
  launch_.reset();
  return answer;
}

Status BucketFlight::overran(const std::string& job, const std::string& op, std::chrono::milliseconds execution,
                             std::chrono::milliseconds job_timeout) const {
  const Launch& flight = *launch_;
  const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                         flight.launched);
  return Status::timeout(
      job + ": bucket " + std::to_string(flight.bucket) + " of operation " + std::to_string(flight.seq) + " (" + op +
      ", group '" + flight.group + "') has executed for " + std::to_string(ran.count()) +
      " ms, over the execution bound of " + std::to_string(execution.count()) +
      " ms (gradsyncd --execution-timeout-ms)" +
      (flight.cross_node ? " plus the job timeout of " + std::to_string(job_timeout.count()) +
                               " ms for the other nodes to reach it; the collective across nodes is stuck"
                         : ""));
}

void BucketFlight::wait(const Logger& log) {
  if (!launch_) return;
  WakeWord& doorbell = doorbell_->page()->doorbell;
  auto next_note = std::chrono::steady_clock::now() + kWaitNote;
  while (!has_landed_.load()) {
    doorbell.wait_until([&] { return has_landed_.load(); }, std::chrono::steady_clock::now() + kWaitSlice);
    if (!has_landed_.load() && std::chrono::steady_clock::now() >= next_note) {
      log.warning("still waiting for bucket " + std::to_string(launch_->bucket) + " of operation " +
                  std::to_string(launch_->seq) + " to come back from its executor after the abort");
      next_note += kWaitNote;
    }
  }
  {
    MutexLock lock(mutex_);
    answer_.reset();
    has_landed_.store(false);
  }
  launch_.reset();
}

}  // namespace gradsync
