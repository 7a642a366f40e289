// Which GPUs a sticky CUDA error has made unusable for this daemon, and who must hear of it.
//
// A sticky error (an illegal address, a kernel that faulted) breaks the daemon's context on
// that GPU for every later call, of every job, and only a new process recovers (GPU-NOTES.md).
// So the first executor that meets one reports it here, once per GPU:
//   - every executor with work on that GPU fails its job with an error that says so (its
//     listener), and executors of other GPUs are left alone;
//   - then the daemon's own handler runs once: it drains what it can and exits with a distinct
//     status, so that systemd restarts it (Restart=on-failure).
// Listeners are called on the reporting thread, outside the watch's lock; a Subscription that
// goes waits for a call of its listener that is running.
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "shared/status.h"
#include "shared/mutex.h"

namespace gradsync::cuda {

class GpuWatch {
 public:
  using OnBroken = std::function<void(int device, const Status& why)>;

  // `on_first_broken`: the daemon's handler, called once, after the listeners of the first GPU
  // reported broken. May be empty (tests).
  explicit GpuWatch(OnBroken on_first_broken = {}) : on_first_broken_(std::move(on_first_broken)) {}
  GpuWatch(const GpuWatch&) = delete;
  GpuWatch& operator=(const GpuWatch&) = delete;

  class Subscription {
   public:
    Subscription() = default;
    ~Subscription() { reset(); }
    Subscription(Subscription&& other) noexcept : link_(std::move(other.link_)) {}
    Subscription& operator=(Subscription&& other) noexcept {
      reset();
      link_ = std::move(other.link_);
      return *this;
    }
    // Stops the calls; waits for one that is running.
    void reset();

   private:
    friend class GpuWatch;
    struct Link {
      Mutex mutex;
      OnBroken listener GS_GUARDED_BY(mutex);  // empty once unsubscribed
    };
    std::shared_ptr<Link> link_;
  };

  // `listener` hears of every GPU reported broken from now on, until the Subscription goes.
  Subscription subscribe(OnBroken listener);

  // Marks `device` broken with `why` (the first report wins) and tells the listeners and then,
  // the first time any GPU breaks, the daemon. Later reports of the same GPU do nothing.
  void report(int device, const Status& why);

  // Ok, or why `device` is unusable.
  Status broken(int device) const;

 private:
  OnBroken on_first_broken_;
  mutable Mutex mutex_;
  std::map<int, Status> broken_ GS_GUARDED_BY(mutex_);
  std::vector<std::weak_ptr<Subscription::Link>> listeners_ GS_GUARDED_BY(mutex_);
  bool told_daemon_ GS_GUARDED_BY(mutex_) = false;
};

}  // namespace gradsync::cuda
