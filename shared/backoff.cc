#include "shared/backoff.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <thread>

#include "shared/wake_word.h"  // cpu_relax

namespace gradsync {

TimerSlackScope::TimerSlackScope(std::chrono::nanoseconds slack) {
  const int previous = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  if (previous < 0) return;
  if (prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack.count()), 0, 0, 0) == 0) previous_ = previous;
}

TimerSlackScope::~TimerSlackScope() {
  if (previous_ >= 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(previous_), 0, 0, 0);
}

void set_thread_timer_slack(std::chrono::nanoseconds slack) {
  prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack.count()), 0, 0, 0);
}

void Backoff::pause() {
  const auto now = std::chrono::steady_clock::now();
  if (!start_) start_ = now;
  const auto polled = now - *start_;
  if (polled < options_.spin) {
    for (int i = 0; i < 16; ++i) cpu_relax();
    return;
  }
  if (polled < options_.yield_until) {
    sched_yield();
    return;
  }
  if (!slack_) slack_.emplace(kPollingTimerSlack);
  std::this_thread::sleep_for(sleep_);
  ++sleeps_;
  sleep_ = std::min(sleep_ * 2, options_.max_sleep);
}

void Backoff::reset() {
  start_.reset();
  sleep_ = options_.first_sleep;
}

}  // namespace gradsync
