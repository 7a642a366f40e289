#include "daemon/job/settings_schedule.h"

#include <algorithm>

namespace gradsync {

SettingsSchedule::SettingsSchedule(SettingsScheduleOptions options) : options_(std::move(options)) {}

SettingsSchedule::~SettingsSchedule() { stop(Status::aborted("job " + options_.job_id + " is shutting down")); }

bool SettingsSchedule::begin(uint64_t seq, std::vector<JobSettings>* due) {
  MutexLock lock(mutex_);
  if (hold_) return false;
  while (!scheduled_.empty() && scheduled_.front().first <= seq) {
    due->push_back(std::move(scheduled_.front().second));
    scheduled_.pop_front();
  }
  begun_through_ = seq;
  return true;
}

uint64_t SettingsSchedule::schedule_here(const JobSettings& settings) {
  MutexLock lock(mutex_);
  const uint64_t from = begun_through_ + 1;
  scheduled_.emplace_back(from, settings);
  return from;
}

void SettingsSchedule::follow(std::shared_ptr<ConfigChannel> channel) {
  {
    MutexLock lock(mutex_);
    if (channel_) return;
    channel_ = channel;
  }
  watcher_ = std::thread([this, channel] { watch(channel); });
}

Status SettingsSchedule::propose(const JobSettings& settings, std::chrono::milliseconds bound, uint64_t* from_seq) {
  std::shared_ptr<ConfigChannel> channel;
  {
    MutexLock lock(mutex_);
    channel = channel_;
  }
  if (!channel) {
    return Status::not_supported("job " + options_.job_id +
                                 " has not formed across its nodes yet; its settings can change once it has");
  }
  // One deadline for publishing and agreeing, so the caller's own bound holds.
  bound = std::min(bound, options_.agreement_bound);
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  uint64_t k = 0;
  if (Status s = channel->propose(settings.encode(), left(), &k); !s.ok()) {
    return Status(s.code(), "job " + options_.job_id + ": could not publish the change at the rendezvous: " + s.message());
  }
  if (Status s = channel->agree(k, left(), from_seq); !s.ok()) {
    return Status(s.code(), "job " + options_.job_id + ": the nodes did not all take change " + std::to_string(k) +
                                " within " + std::to_string(bound.count()) + " ms: " + s.message());
  }
  return Status();
}

void SettingsSchedule::stop(const Status& why) {
  std::shared_ptr<ConfigChannel> channel;
  {
    MutexLock lock(mutex_);
    channel = channel_;
  }
  if (channel) channel->cancel(why);
  if (watcher_.joinable()) watcher_.join();
}

bool SettingsSchedule::wait_for_change(ConfigChannel& channel, uint64_t k, std::string* text) {
  const auto bound = options_.agreement_bound;
  bool claimed_before = false;  // k was claimed already at the previous wait's end
  for (;;) {
    const Status status = channel.wait(k, std::chrono::seconds(60), text);
    if (status.ok()) return true;
    if (channel.cancelled() || options_.failed()) return false;  // the job ended
    if (status.code() == ErrorCode::kTimeout) {
      // A number claimed but never published would block every later change: one claimed a
      // whole wait ago and still unpublished is given up (its proposer died or was cut off).
      bool claimed = false;
      Status checked = channel.claimed(k, bound, &claimed);
      if (checked.ok() && claimed && claimed_before) checked = channel.give_up(k, bound);
      if (!checked.ok() && !channel.cancelled()) options_.log.warning("settings watcher: " + checked.message());
      claimed_before = checked.ok() && claimed;
      continue;
    }
    // The rendezvous may be briefly unreachable; the watcher must outlive that, or this node
    // would never offer for the next change and the job would fail then.
    options_.log.warning("settings watcher: cannot reach the rendezvous (" + status.message() + "); retrying");
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

bool SettingsSchedule::pause_after_skip(ConfigChannel& channel) {
  std::this_thread::sleep_for(kSkipPause);
  return !channel.cancelled() && !options_.failed();
}

void SettingsSchedule::watch(std::shared_ptr<ConfigChannel> channel) {
  const auto bound = options_.agreement_bound;
  for (uint64_t k = 1;; ++k) {
    std::string text;
    if (!wait_for_change(*channel, k, &text)) return;
    JobSettings settings;
    // A skipped change pauses the watcher briefly: changes come from operators, a few at a
    // time, and a store answering every one at once (no honest store does) must not make the
    // watcher spin and fill the log.
    if (text == ConfigChannel::kSkip) {
      options_.log.info("settings change " + std::to_string(k) + " was given up unpublished; skipped");
      if (!pause_after_skip(*channel)) return;
      continue;
    }
    if (!JobSettings::decode(text, &settings)) {
      // Every node reads the same value, so every node skips it alike.
      options_.log.warning("settings change " + std::to_string(k) + " at the rendezvous is malformed or out of "
                           "range; skipped");
      if (!pause_after_skip(*channel)) return;
      continue;
    }
    uint64_t hold = 0;
    {
      MutexLock lock(mutex_);
      hold_ = true;
      hold = begun_through_ + 1;
    }
    uint64_t from = 0;
    Status status = channel->offer(k, hold, bound);
    if (status.ok()) status = channel->agree(k, bound, &from);
    if (!status.ok()) {
      if (channel->cancelled() || options_.failed()) return;
      // The other nodes may or may not apply it; going on with either settings could mix
      // buckets across nodes. The hold stays: the job fails.
      options_.fail(Status(status.code(), "job " + options_.job_id + ": the nodes did not agree on when settings "
                                              "change " + std::to_string(k) + " (" + settings.describe() +
                                              ") takes effect: " + status.message()));
      return;
    }
    {
      MutexLock lock(mutex_);
      scheduled_.emplace_back(from, settings);
      hold_ = false;
    }
    options_.wake();
  }
}

}  // namespace gradsync
