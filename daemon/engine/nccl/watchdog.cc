#include "daemon/engine/nccl/watchdog.h"

#include <algorithm>
#include <vector>

#include "shared/backoff.h"

namespace gradsync::nccl {

Watchdog::Watchdog(WatchedComms* comms, std::chrono::milliseconds poll, std::chrono::microseconds completion_poll)
    : comms_(comms), poll_(poll), completion_poll_(std::min<std::chrono::microseconds>(completion_poll, poll)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    if (!in_flight_.empty() && abort_requested_.ok()) abort_requested_ = Status::aborted("the NCCL engine was closed");
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(InFlight item) {
  MutexLock lock(mutex_);
  // After a failure, answered at once, but only once the communicators are aborted: until then
  // the item waits for fail_all() to answer it.
  if (!failure_.ok() && aborted_comms_) {
    const Status why = failure_;
    lock.unlock();
    return item.done(why);
  }
  const auto deadline = std::chrono::steady_clock::now() + item.timeout;
  in_flight_.push_back(Watched{std::move(item), deadline});
  // An idle watchdog sleeps a whole poll period; the new item is polled now instead.
  kicked_ = true;
  lock.unlock();
  wake_.notify_all();
}

void Watchdog::abort(const Status& why) {
  {
    MutexLock lock(mutex_);
    if (!abort_requested_.ok() || !failure_.ok()) return;
    abort_requested_ = why.ok() ? Status::aborted("aborted") : why;
  }
  wake_.notify_all();
}

Status Watchdog::failure() const {
  MutexLock lock(mutex_);
  return failure_;
}

void Watchdog::fail_all(const Status& why) {
  if (failure_.ok()) failure_ = why;
  const Status failure = failure_;  // answered without the lock
  // Abort before answering: once a caller has its answer it may release the buffers, and the
  // aborted communicators no longer touch them. What is watched meanwhile waits (watch()).
  if (!aborted_comms_) {
    {
      MutexUnlock unlocked(mutex_);
      comms_->abort_all();
    }
    aborted_comms_ = true;
  }
  while (!in_flight_.empty()) {
    std::deque<Watched> failed;
    failed.swap(in_flight_);
    MutexUnlock unlocked(mutex_);
    for (Watched& w : failed) w.item.done(failure);
  }
}

void Watchdog::run() {
  // Every timed wait of this thread is a poll: without this, each would last 50 us more.
  set_thread_timer_slack(kPollingTimerSlack);
  // While anything is in flight the head is polled after 2 us, then 4, 8, ... up to
  // completion_poll_, and from 2 us again once something finished or was added: a small bucket
  // is answered microseconds after the GPU is through it. A head that has not moved for 10 ms
  // (peers still in their backward pass) is polled less and less often, up to every 1 ms.
  constexpr std::chrono::microseconds kFirstCompletionWait{2};
  constexpr std::chrono::milliseconds kSlowAfter{10};
  std::chrono::microseconds completion_wait = std::min(kFirstCompletionWait, completion_poll_);
  auto progress = std::chrono::steady_clock::now();
  MutexLock lock(mutex_);
  for (;;) {
    // Wakes for a stop, or for an abort not acted on yet; otherwise polls. (A predicate that
    // stayed true after the abort was handled would spin holding the lock.)
    const std::chrono::microseconds period = in_flight_.empty() ? std::chrono::microseconds(poll_) : completion_wait;
    const auto until = std::chrono::steady_clock::now() + period;
    while (!stopping_ && !kicked_ && !(!abort_requested_.ok() && failure_.ok()) && wake_.wait_until(lock, until)) {
    }
    if (kicked_) {
      completion_wait = std::min(kFirstCompletionWait, completion_poll_);
      progress = std::chrono::steady_clock::now();
    }
    kicked_ = false;
    if (!abort_requested_.ok() && failure_.ok()) fail_all(abort_requested_);
    if (!failure_.ok() && !in_flight_.empty()) fail_all(failure_);  // watched during an abort
    if (failure_.ok() && std::chrono::steady_clock::now() - last_error_check_ >= poll_) {
      last_error_check_ = std::chrono::steady_clock::now();
      lock.unlock();
      Status error = comms_->async_error();
      lock.lock();
      if (!error.ok()) fail_all(Status(error.code(), "NCCL reported an error: " + error.message(), error.where()));
    }
    // Answer what finished, in order; the first one past its deadline fails the engine. The
    // head is polled without the lock, so watch() never waits on a CUDA call.
    const auto now = std::chrono::steady_clock::now();
    std::vector<EngineDone> finished;
    while (failure_.ok() && !in_flight_.empty()) {
      const std::function<Status(bool*)> poll = in_flight_.front().item.poll;
      lock.unlock();
      bool done = false;
      const Status polled = poll(&done);
      lock.lock();
      if (!failure_.ok() || in_flight_.empty()) break;
      Watched& head = in_flight_.front();
      if (!polled.ok()) {
        fail_all(Status(polled.code(), "NCCL " + head.item.what + ": " + polled.message(), polled.where()));
        break;
      }
      if (done) {
        finished.push_back(std::move(head.item.done));
        in_flight_.pop_front();
        continue;
      }
      if (now >= head.deadline) {
        const std::string what = head.item.what;
        const auto ms = head.item.timeout.count();
        fail_all(Status::timeout("NCCL " + what + " did not finish within " + std::to_string(ms) +
                                 " ms; the job's communicators were aborted"));
      }
      break;
    }
    if (!finished.empty()) {
      lock.unlock();
      for (auto& done : finished) done(Status());
      lock.lock();
      completion_wait = std::min(kFirstCompletionWait, completion_poll_);
      progress = std::chrono::steady_clock::now();
    } else {
      const bool slow = std::chrono::steady_clock::now() - progress > kSlowAfter;
      const std::chrono::microseconds cap =
          slow ? std::min<std::chrono::microseconds>(poll_, std::chrono::milliseconds(1)) : completion_poll_;
      completion_wait = std::min(completion_wait * 2, std::max(cap, completion_poll_));
    }
    if (stopping_ && (in_flight_.empty() || !failure_.ok())) {
      if (!in_flight_.empty()) fail_all(failure_);
      return;
    }
  }
}

}  // namespace gradsync::nccl
