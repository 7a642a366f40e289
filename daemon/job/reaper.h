// Retires what ended jobs leave behind, off the io thread. Stopping a job's worker waits for the
// bucket it is executing; with its engines aborted that is short, but the io thread must keep
// serving every other job meanwhile, and one slow retirement must never delay another. Each
// retirement runs on a thread of its own; the Reaper joins them all before it is destroyed.
#pragma once

#include <functional>
#include <list>
#include <thread>
#include "shared/mutex.h"

namespace gradsync {

class Reaper {
 public:
  Reaper() = default;
  ~Reaper();  // waits for every retirement handed over
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  void adopt(std::function<void()> retire);

 private:
  struct Retirement {
    std::thread thread;
    bool done = false;  // guarded by the reaper's mutex_ (nested: not expressible as an annotation)
  };

  Mutex mutex_;
  std::list<Retirement> retirements_ GS_GUARDED_BY(mutex_);  // finished ones are joined on the next adopt
};

}  // namespace gradsync
