#include "daemon/util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>

namespace gradsync {

// Tasks are claimed with an atomic counter, so a batch needs the pool's mutex only to be
// published and retired.
struct ThreadPool::Batch {
  const std::function<void(size_t)>* task = nullptr;
  size_t count = 0;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  Mutex mutex;
  CondVar finished;
  std::exception_ptr failed GS_GUARDED_BY(mutex);  // the first task's exception
};

ThreadPool::ThreadPool(size_t threads) {
  for (size_t i = 1; i < std::max<size_t>(threads, 1); ++i) workers_.emplace_back([this] { run_worker(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

// Lifetime rule: a helper touches a batch only while it holds a claimed, unfinished task of it,
// and the owner cannot return before every claimed task is finished. Helpers claim under the
// pool mutex (so the owner's removal of the batch is ordered with the claim), and the last
// increment of `done` happens under the batch mutex (so the owner cannot return, and destroy
// the batch, while the helper still touches it).
void ThreadPool::finish_one(Batch& batch, size_t i) {
  std::exception_ptr failed;
  try {
    (*batch.task)(i);
  } catch (...) {
    failed = std::current_exception();
  }
  MutexLock lock(batch.mutex);
  if (failed && !batch.failed) batch.failed = failed;
  if (batch.done.fetch_add(1) + 1 == batch.count) batch.finished.notify_all();
}

void ThreadPool::parallel_for(size_t count, const std::function<void(size_t)>& task) {
  if (count == 0) return;
  if (count == 1 || workers_.empty()) {
    for (size_t i = 0; i < count; ++i) task(i);
    return;
  }
  Batch batch;
  batch.task = &task;
  batch.count = count;
  {
    MutexLock lock(mutex_);
    batches_.push_back(&batch);
  }
  wake_.notify_all();
  for (size_t i = batch.next.fetch_add(1); i < count; i = batch.next.fetch_add(1)) finish_one(batch, i);
  {
    MutexLock lock(mutex_);
    batches_.erase(std::find(batches_.begin(), batches_.end(), &batch));
  }
  // Helpers may still be inside a task they claimed; the batch must outlive them.
  std::exception_ptr failed;
  {
    MutexLock lock(batch.mutex);
    while (batch.done.load() != batch.count) batch.finished.wait(lock);
    failed = batch.failed;
  }
  if (failed) std::rethrow_exception(failed);
}

void ThreadPool::run_worker() {
  MutexLock lock(mutex_);
  for (;;) {
    while (!stopping_ && std::none_of(batches_.begin(), batches_.end(),
                                      [](Batch* b) { return b->next.load() < b->count; })) {
      wake_.wait(lock);
    }
    if (stopping_) return;
    for (Batch* batch : batches_) {
      const size_t i = batch->next.fetch_add(1);
      if (i >= batch->count) continue;
      lock.unlock();
      finish_one(*batch, i);
      lock.lock();
      break;  // the list may have changed while unlocked
    }
  }
}

}  // namespace gradsync
