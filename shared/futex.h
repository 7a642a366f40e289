// Cross-process futex wait/wake on a 32-bit word in MAP_SHARED memory (so the shared, not the
// private, futex operations). This is the wake-up primitive of the per-step rings: about 8 us
// round trip here, against 50-70 us for a pipe or eventfd (../shared/bench/wakeup_latency.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gradsync {

// Sleeps while *word == expected, at most `timeout`. Returns early on a wake, a signal or a
// spurious wake-up; callers re-check their condition in a loop.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);

// Wakes every waiter on word.
void futex_wake_all(std::atomic<uint32_t>* word);

}  // namespace gradsync
