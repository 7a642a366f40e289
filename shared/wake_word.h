// A wake-up word in shared memory: one process publishes something and notifies, another
// waits until a predicate over the published data holds. No wake-up is lost:
//   notifier: publish data; fence; if (waiters > 0) { seq += 1; futex_wake(seq) }
//   waiter:   s = seq; if ready() return; waiters += 1; fence; if (!ready()) futex_wait(seq == s)
// All four steps use sequentially consistent atomics, so either the waiter sees the data or
// the notifier sees the waiter (or seq has moved and futex_wait returns at once).
// The notifier pays a futex syscall only when somebody sleeps.
//
// `seq` is written only by the notifier and `waiters` only by the waiter, so the two words may
// live in different memory (WakeRef): the daemon's completion wake-up keeps `seq` in memory the
// client can only read, and `waiters` in memory the client writes.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "shared/futex.h"

namespace gradsync {

// A spin-wait hint: lets the sibling hyperthread run and saves power while polling.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How a waiter polls before it sleeps on the futex: `pauses` checks each after a spin-wait hint,
// which catch the other side when it runs on another idle core; then `yields` checks each after
// sched_yield(), which catch it when it does not: the core goes to whoever is runnable (the other
// side, on a machine with fewer free cores than busy processes) and a futex sleep and wake-up
// are saved either way. Measured on the 2-vCPU benchmark machine, 2 clients x 4 KiB: p50 about
// 24 us without yields, 12-17 us with them (README "Where the time goes").
struct Polling {
  int pauses = 0;
  int yields = 0;
};

struct WakeRef {
  std::atomic<uint32_t>* seq = nullptr;
  std::atomic<uint32_t>* waiters = nullptr;

  // Without a waiter nothing is written: a notifier on a hot path (one mark_ready per tensor)
  // does not bounce the word's cache line to the awake waiter. Still no lost wake-up, thanks to
  // the two fences: callers publish with plain release stores (a ring's tail), which a CPU may
  // let a later load overtake (x86 store-to-load reordering), so the publish is fenced before
  // `waiters` is read, as the waiter's increment is fenced before it re-checks ready(). Then
  // either the notifier sees the waiter or the waiter sees the publication. (The unconditional
  // seq.fetch_add this replaced was a locked instruction, which fenced as a side effect.)
  void notify() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters->load() > 0) {
      seq->fetch_add(1);
      futex_wake_all(seq);
    }
  }

  // Waits until ready() or the deadline, polling first as `polling` says. Returns ready()'s
  // final value. The memory is shared with another process that may be broken or hostile: a
  // corrupted word can only cause extra or late wake-ups, never an unbounded sleep, because
  // every sleep is bounded by the deadline.
  template <class Ready>
  bool wait_until(Ready&& ready, std::chrono::steady_clock::time_point deadline, Polling polling = {}) const {
    for (int i = 0; i < polling.pauses; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    // A yield may give up a whole time slice on a busy machine: mind the deadline.
    for (int i = 0; i < polling.yields && std::chrono::steady_clock::now() < deadline; ++i) {
      if (ready()) return true;
      sched_yield();
    }
    for (;;) {
      const uint32_t seen = seq->load();
      if (ready()) return true;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return false;
      waiters->fetch_add(1);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (!ready()) futex_wait(seq, seen, deadline - now);
      waiters->fetch_sub(1);
    }
  }
};

// Both words together, for memory that notifier and waiter may both write.
struct WakeWord {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};

  WakeRef ref() { return WakeRef{&seq, &waiters}; }
  void notify() { ref().notify(); }
  template <class Ready>
  bool wait_until(Ready&& ready, std::chrono::steady_clock::time_point deadline, Polling polling = {}) {
    return ref().wait_until(std::forward<Ready>(ready), deadline, polling);
  }
};

}  // namespace gradsync
