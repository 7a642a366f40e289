#include "daemon/job/reaper.h"

namespace gradsync {

Reaper::Reaper() : thread_([this] { run(); }) {}

Reaper::~Reaper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Reaper::adopt(std::function<void()> retire) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(retire));
  }
  wake_.notify_all();
}

void Reaper::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to retire
    auto retire = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    retire();
    lock.lock();
  }
}

}  // namespace gradsync
