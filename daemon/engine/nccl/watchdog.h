// The NCCL engine's watchdog, after PyTorch's ProcessGroupNCCL watchdog: one thread per engine
// polls, about every 100 ms, the completion of every collective in flight (its done event), the
// communicators' asynchronous errors (ncclCommGetAsyncError), and each collective's deadline.
// On an error, a timeout or an abort() it aborts every communicator of the job once
// (ncclCommAbort; NCCL's non-blocking mode makes that safe while no other thread is inside
// NCCL) and fails every collective in flight, and every later one, with an error naming the
// cause. The communicators and the events are behind WatchedComms and InFlight, so host tests
// drive all of it with fakes that fail, hang until aborted, or time out.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "daemon/engine/host_engine.h"
#include "shared/status.h"
#include "shared/mutex.h"

namespace gradsync::nccl {

// The communicators of one engine, as the watchdog sees them.
class WatchedComms {
 public:
  virtual ~WatchedComms() = default;
  // Ok, or the first asynchronous error of any communicator, naming it.
  virtual Status async_error() = 0;
  // Aborts every communicator. Called at most once, on the watchdog's thread.
  virtual void abort_all() = 0;
};

// One collective in flight.
struct InFlight {
  std::string what;                 // "allreduce of 26214400 bytes", for errors
  // Polls its done event (cudaEventQuery): *done once the GPU is through it; an error when the
  // query itself fails (a sticky CUDA error), which fails the engine instead of looking like
  // "not yet" until the timeout.
  std::function<Status(bool* done)> poll;
  EngineDone done;                  // answered exactly once, on the watchdog's thread
  std::chrono::milliseconds timeout{30'000};
};

class Watchdog {
 public:
  // `poll`: how often asynchronous errors and deadlines are checked. `completion_poll`: how
  // often the head of the queue is polled while anything is in flight, since its answer gates
  // the job's next bucket (short: a bucket of a few KiB takes microseconds).
  explicit Watchdog(WatchedComms* comms, std::chrono::milliseconds poll = std::chrono::milliseconds(100),
                    std::chrono::microseconds completion_poll = std::chrono::microseconds(50));
  ~Watchdog();  // aborts (if anything is in flight), answers everything, joins
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches a collective that was just enqueued. After a failure it is answered with that
  // failure: at once when the communicators are already aborted, else once they are. Any thread.
  void watch(InFlight item);

  // Aborts: the communicators are aborted and everything in flight fails with `why` within
  // one poll. Any thread; never blocks; idempotent.
  void abort(const Status& why);

  // The sticky failure; ok while healthy.
  Status failure() const;

 private:
  struct Watched {
    InFlight item;
    std::chrono::steady_clock::time_point deadline;
  };
  void run();
  // Fails everything with `why` and aborts the communicators (once). Watchdog thread only.
  void fail_all(const Status& why) GS_REQUIRES(mutex_);

  WatchedComms* comms_;
  const std::chrono::milliseconds poll_;
  const std::chrono::microseconds completion_poll_;
  std::chrono::steady_clock::time_point last_error_check_{};  // watchdog thread only
  mutable Mutex mutex_;
  CondVar wake_;
  std::deque<Watched> in_flight_ GS_GUARDED_BY(mutex_);  // in the order they were enqueued
  Status failure_ GS_GUARDED_BY(mutex_);
  Status abort_requested_ GS_GUARDED_BY(mutex_);
  bool aborted_comms_ GS_GUARDED_BY(mutex_) = false;  // set once abort_all() returned
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  bool kicked_ GS_GUARDED_BY(mutex_) = false;  // watch() added an item
  std::thread thread_;
};

}  // namespace gradsync::nccl
