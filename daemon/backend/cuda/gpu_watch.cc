#include "daemon/backend/cuda/gpu_watch.h"

#include <algorithm>
#include <vector>

namespace gradsync::cuda {

void GpuWatch::Subscription::reset() {
  if (!link_) return;
  // The link may die with this reference: it is released after the lock (declared first,
  // destroyed last), never while its mutex is held.
  const std::shared_ptr<Link> link = std::move(link_);
  MutexLock lock(link->mutex);
  link->listener = nullptr;
}

GpuWatch::Subscription GpuWatch::subscribe(OnBroken listener) {
  Subscription subscription;
  subscription.link_ = std::make_shared<Subscription::Link>();
  {
    MutexLock fresh(subscription.link_->mutex);  // no other thread has the link yet
    subscription.link_->listener = std::move(listener);
  }
  MutexLock lock(mutex_);
  std::erase_if(listeners_, [](const auto& weak) { return weak.expired(); });
  listeners_.push_back(subscription.link_);
  return subscription;
}

void GpuWatch::report(int device, const Status& why) {
  std::vector<std::shared_ptr<Subscription::Link>> links;
  bool tell_daemon = false;
  {
    MutexLock lock(mutex_);
    if (!broken_.emplace(device, why).second) return;
    for (const auto& weak : listeners_) {
      if (auto link = weak.lock()) links.push_back(std::move(link));
    }
    tell_daemon = !told_daemon_;
    told_daemon_ = true;
  }
  for (const auto& link : links) {
    MutexLock lock(link->mutex);
    if (link->listener) link->listener(device, why);
  }
  if (tell_daemon && on_first_broken_) on_first_broken_(device, why);
}

Status GpuWatch::broken(int device) const {
  MutexLock lock(mutex_);
  auto it = broken_.find(device);
  return it == broken_.end() ? Status() : it->second;
}

}  // namespace gradsync::cuda
