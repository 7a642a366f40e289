// The project's mutex, lock and condition variable: std::mutex, std::unique_lock and
// std::condition_variable under names that Clang's thread-safety analysis understands
// (shared/thread_annotations.h). libstdc++'s own types carry no annotations, so a member
// GS_GUARDED_BY a std::mutex could not be checked. They cost nothing over the std types.
//
//   mutable Mutex mutex_;
//   int count_ GS_GUARDED_BY(mutex_) = 0;
//   ...
//   MutexLock lock(mutex_);        // held to the end of the scope
//   while (count_ == 0) changed_.wait(lock);
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "shared/thread_annotations.h"

namespace gradsync {

class GS_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() GS_ACQUIRE() { mutex_.lock(); }
  void unlock() GS_RELEASE() { mutex_.unlock(); }
  bool try_lock() GS_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Holds a Mutex from construction to destruction; unlock() and lock() release and retake it
// within the scope (to call out without it, say).
class GS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) GS_ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() GS_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() GS_RELEASE() { lock_.unlock(); }
  void lock() GS_ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// Releases a held Mutex for its scope and takes it back at its end: to call out without the
// lock (a callback, a blocking library call) from a function that GS_REQUIRES it.
class GS_SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex& mutex) GS_RELEASE(mutex) : mutex_(mutex) { mutex_.unlock(); }
  // Ends the scope (the analysis models it as a release of the scope), retaking the mutex.
  ~MutexUnlock() GS_RELEASE() { mutex_.lock(); }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex& mutex_;
};

// A condition variable waited on with a MutexLock held. No predicate overloads: the caller
// loops on its condition in its own body, where the analysis can see that the lock is held
// while it reads the guarded state.
class CondVar {
 public:
  void wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  // False when `deadline` passed first (the caller re-checks its condition either way).
  template <class Clock, class Duration>
  bool wait_until(MutexLock& lock, std::chrono::time_point<Clock, Duration> deadline) {
    return cv_.wait_until(lock.lock_, deadline) == std::cv_status::no_timeout;
  }
  template <class Rep, class Period>
  bool wait_for(MutexLock& lock, std::chrono::duration<Rep, Period> timeout) {
    return cv_.wait_for(lock.lock_, timeout) == std::cv_status::no_timeout;
  }
  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace gradsync
