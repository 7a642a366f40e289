// Retires what ended jobs leave behind, off the io thread. Stopping a job's worker waits for
// the bucket it is executing, and a bucket that crosses nodes can wait on a stuck peer until
// the job timeout; the io thread must keep serving every other job meanwhile. The Reaper runs
// each retirement on its own thread, in order, and finishes all of them before it is destroyed.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace gradsync {

class Reaper {
 public:
  Reaper();
  ~Reaper();  // runs every retirement handed over, then joins
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  void adopt(std::function<void()> retire);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;  // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::thread thread_;
};

}  // namespace gradsync
