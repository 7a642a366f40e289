// Polling a condition that nothing signals, such as a CUDA event's completion, which can only be
// queried: spin, then yield, then sleep, as the host path's wake-ups do (wake_word.h), so that
// a wait that ends within microseconds costs microseconds, and a long one costs no core.
//
// Sleeps are short (2 us at first, doubling up to `max_sleep`), and Linux stretches every sleep
// by the thread's timer slack (50 us by default), which would turn each into about 55 us and
// set the round trip of a small bucket. So a Backoff that sleeps first sets its thread's slack
// to 1 us (PR_SET_TIMERSLACK) and puts the previous slack back when it goes: the caller's
// thread (a trainer's, in the client library) is left as it was found.
#pragma once

#include <chrono>
#include <optional>

namespace gradsync {

// Sets the calling thread's timer slack for the scope's life, then restores it.
class TimerSlackScope {
 public:
  explicit TimerSlackScope(std::chrono::nanoseconds slack);
  ~TimerSlackScope();
  TimerSlackScope(const TimerSlackScope&) = delete;
  TimerSlackScope& operator=(const TimerSlackScope&) = delete;

 private:
  long previous_ = -1;  // -1: nothing to restore (the prctl failed)
};

// Sets the calling thread's timer slack for good: for threads of the daemon's own whose every
// timed wait is a poll (an engine's watchdog).
void set_thread_timer_slack(std::chrono::nanoseconds slack);

inline constexpr std::chrono::nanoseconds kPollingTimerSlack{1000};

class Backoff {
 public:
  struct Options {
    // Since the first pause(): spin (a pause instruction per poll) this long, then yield the
    // core (sched_yield) until `yield_until`, then sleep.
    std::chrono::microseconds spin{20};
    std::chrono::microseconds yield_until{100};
    std::chrono::microseconds first_sleep{2};
    std::chrono::microseconds max_sleep{200};
  };
  Backoff() : Backoff(Options{}) {}
  explicit Backoff(Options options) : options_(options), sleep_(options.first_sleep) {}
  Backoff(const Backoff&) = delete;
  Backoff& operator=(const Backoff&) = delete;

  // Waits before the caller polls again: how, and how long, depends on how long it has been
  // polling. Never longer than max_sleep plus the timer slack.
  void pause();
  // The condition changed (progress): start from spinning again.
  void reset();

  // How many pauses slept (for tests).
  int sleeps() const { return sleeps_; }

 private:
  Options options_;
  std::optional<std::chrono::steady_clock::time_point> start_;
  std::chrono::microseconds sleep_;
  int sleeps_ = 0;
  std::optional<TimerSlackScope> slack_;  // set at the first sleep
};

}  // namespace gradsync
