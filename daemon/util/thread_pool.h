// A fixed set of reduction threads shared by every job's worker. parallel_for() runs a batch of
// independent tasks on the pool and on the calling thread, and returns when all are done, so a
// worker never sleeps while its own batch is unfinished. Batches from several jobs may run at
// once; they share the threads.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>
#include "shared/mutex.h"

namespace gradsync {

class ThreadPool {
 public:
  // `threads` counts the caller too: ThreadPool(1) starts no threads and runs everything inline.
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls task(i) for i in [0, count), in any order and on any thread. A task that throws (memory
  // running out in a task's own buffers) still counts as done; once every task is, the first
  // exception is rethrown on the caller's thread, never on a pool thread.
  void parallel_for(size_t count, const std::function<void(size_t)>& task);

 private:
  struct Batch;
  void run_worker();
  static void finish_one(Batch& batch, size_t i);

  Mutex mutex_;
  CondVar wake_;
  std::deque<Batch*> batches_ GS_GUARDED_BY(mutex_);
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace gradsync
