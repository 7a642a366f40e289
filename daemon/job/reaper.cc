#include "daemon/job/reaper.h"

#include <malloc.h>

namespace gradsync {

Reaper::~Reaper() {
  std::list<Retirement> all;
  {
    MutexLock lock(mutex_);
    all.swap(retirements_);
  }
  for (auto& retirement : all) retirement.thread.join();
}

void Reaper::adopt(std::function<void()> retire) {
  std::list<Retirement> finished;
  {
    MutexLock lock(mutex_);
    for (auto it = retirements_.begin(); it != retirements_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), retirements_, it);
      it = next;
    }
    Retirement& slot = retirements_.emplace_back();  // list nodes never move
    slot.thread = std::thread([this, &slot, retire = std::move(retire)] {
      retire();
      // What a job held (its sets' tables can be tens of MB) goes back to the system, not to
      // glibc's arenas for good.
      ::malloc_trim(0);
      MutexLock done_lock(mutex_);
      slot.done = true;
    });
  }
  // These have finished their work and at most still release the mutex.
  for (auto& retirement : finished) retirement.thread.join();
}

}  // namespace gradsync
