// When a job's settings change (SetConfig): from the first operation that has not begun on any
// of its nodes, so that every node runs every operation with the same settings.
//
// A single-node job schedules a change at once, from the operation after the last one begun. A
// multi-node job agrees through the rendezvous (config_channel.h): the node that got the change
// proposes it, and every node's watcher thread (started by follow() once the job formed)
// follows the numbered changes, holds its worker before the first operation it has not begun,
// offers that operation, and schedules the change from the largest offer.
//
// The worker calls begin() before each operation's first bucket and applies the changes due;
// it never waits for the watcher or the rendezvous (it may be blocked in a set's admission
// meanwhile): the watcher and propose() decide under the lock, from what begin() recorded.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/job/config_channel.h"
#include "daemon/job/job_settings.h"
#include "daemon/util/log.h"
#include "shared/mutex.h"
#include "shared/status.h"

namespace gradsync {

struct SettingsScheduleOptions {
  std::string job_id;
  // How long the nodes wait for each other's part in a change (the worker gives the job
  // timeout, at most 60 s).
  std::chrono::milliseconds agreement_bound{60'000};
  // The nodes could not agree when a change takes effect: the job must fail, because going on
  // with either settings could mix buckets across nodes. Called on the watcher thread.
  std::function<void(const Status&)> fail;
  // Whether the job already failed (then the watcher's errors are the failure's echo).
  std::function<bool()> failed;
  // A change was scheduled: wake the worker, which may be holding before an operation.
  std::function<void()> wake;
  Logger log;
};

class SettingsSchedule {
 public:
  explicit SettingsSchedule(SettingsScheduleOptions options);
  ~SettingsSchedule();  // stop()
  SettingsSchedule(const SettingsSchedule&) = delete;
  SettingsSchedule& operator=(const SettingsSchedule&) = delete;

  // The worker, before operation `seq`'s first bucket: false while a change is being agreed
  // (the operation must wait); otherwise appends the changes due by `seq`, oldest first, and
  // records `seq` as begun.
  bool begin(uint64_t seq, std::vector<JobSettings>* due);

  // A single-node job: schedules `settings` from the first operation not begun; returns it.
  uint64_t schedule_here(const JobSettings& settings);

  // A multi-node job, once formed: starts the watcher on `channel`. At most once.
  void follow(std::shared_ptr<ConfigChannel> channel);

  // A multi-node job: publishes `settings` and waits, up to `bound` (at most the agreement
  // bound), for every node to agree from which operation it applies (*from_seq).
  // kNotSupported before follow(): the job has not formed across its nodes yet.
  Status propose(const JobSettings& settings, std::chrono::milliseconds bound, uint64_t* from_seq);

  // Cancels the channel with `why` and joins the watcher. Idempotent.
  void stop(const Status& why);

 private:
  void watch(std::shared_ptr<ConfigChannel> channel);
  // Waits for change k to be published; false when the job ended meanwhile.
  bool wait_for_change(ConfigChannel& channel, uint64_t k, std::string* text);
  // After a change that was skipped: a short pause; false when the job ended meanwhile.
  bool pause_after_skip(ConfigChannel& channel);
  static constexpr std::chrono::milliseconds kSkipPause{100};

  const SettingsScheduleOptions options_;
  Mutex mutex_;
  // Every operation up to begun_through_ has begun with the old settings; none after it may
  // begin while hold_ is set.
  bool hold_ GS_GUARDED_BY(mutex_) = false;
  uint64_t begun_through_ GS_GUARDED_BY(mutex_) = 0;
  std::deque<std::pair<uint64_t, JobSettings>> scheduled_ GS_GUARDED_BY(mutex_);  // by first operation
  std::shared_ptr<ConfigChannel> channel_ GS_GUARDED_BY(mutex_);
  std::thread watcher_;  // started by follow(), joined by stop(); one caller each
};

}  // namespace gradsync
