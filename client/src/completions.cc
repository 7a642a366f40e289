#include "client/src/completions.h"

#include <algorithm>

#include "client/src/device_memory.h"
#include "gradsync/work.h"

namespace gradsync {
namespace {

// How often a waiting client checks that the daemon is still there. The check is a poll() on
// the control socket, so it is off the per-step path unless a wait is already long.
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);

// How a waiting client polls before it sleeps (wake_word.h): a short spin for a daemon on
// another idle core, then yields for one that shares the client's core. A small operation's
// answer comes within microseconds, so its wait polls mostly by yielding, and longer: on the
// 2-vCPU benchmark machine, 2 clients x 4 KiB went from about 21 us to about 15 us (p50).
// Every other wait polls briefly: several clients yielding through a step of milliseconds
// took the cores from the daemon (4 clients x 10,000 small tensors: 1.4-1.6x slower).
constexpr Polling kPolling{200, 50};
constexpr Polling kLatencyBoundPolling{50, 200};

}  // namespace

Completions::Completions(std::shared_ptr<JobChannel> channel, std::function<Status()> daemon_gone,
                         std::function<std::optional<Status>()> aborted)
    : channel_(std::move(channel)),
      daemon_gone_(std::move(daemon_gone)),
      aborted_(std::move(aborted)),
      reader_(&channel_->daemon()->completion, &channel_->client()->completion_cursor) {}

WakeRef Completions::completion_ready() const {
  // The client only waits on this word (it never notifies), so the read-only half is only read.
  return WakeRef{const_cast<std::atomic<uint32_t>*>(&channel_->daemon()->completion_seq),
                 &channel_->client()->completion_waiters};
}

// Reads only the shared atomics, so it is safe without the mutex while another thread drains.
bool Completions::has_entries() const {
  return channel_->daemon()->completion.tail.load(std::memory_order_acquire) !=
         channel_->client()->completion_cursor.head.load(std::memory_order_acquire);
}

Status Completions::daemon_failure() const {
  const DaemonRings* rings = channel_->daemon();
  const uint32_t code = rings->failure_code.load(std::memory_order_acquire);
  if (code == 0) return Status();
  const size_t length = std::min<size_t>(rings->failure_length, sizeof(rings->failure_message));
  return Status(static_cast<ErrorCode>(code), std::string(rings->failure_message, length));
}

Status Completions::cause(Status seen) const {
  if (aborted_) {
    if (std::optional<Status> why = aborted_()) return *why;
  }
  return seen;
}

void Completions::expect(uint64_t seq, bool latency_bound, std::shared_ptr<OpResult> result) {
  MutexLock lock(mutex_);
  if (!failure_.ok()) {
    first_failed_ = std::min(first_failed_, seq);
    return;
  }
  pending_.insert(seq);
  if (latency_bound) latency_bound_.insert(seq);
  if (result) results_[seq] = std::move(result);
}

size_t Completions::pending() const {
  MutexLock lock(mutex_);
  return pending_.size();
}

Status Completions::outcome_locked(uint64_t seq) const { return seq >= first_failed_ ? failure_ : Status(); }

void Completions::drain_locked() {
  // The daemon posts a completion before it publishes a failure, so reading the failure first
  // and the ring second never takes a completed operation for a failed one.
  const Status published = daemon_failure();
  CompletionEntry entry;
  while (reader_.try_pop(&entry) == PopResult::kOk) {
    if (entry.code != 0 && failure_.ok()) {
      // Every failed completion carries the job's sticky error; its whole text is in the
      // daemon's ring memory, the entry holds only its beginning.
      Status whole = daemon_failure();
      if (whole.ok()) {
        const size_t length = std::min<size_t>(entry.message_length, kCompletionMessageBytes);
        whole = Status(static_cast<ErrorCode>(entry.code), std::string(entry.message, length));
      }
      failure_ = cause(std::move(whole));
      failed_.store(true, std::memory_order_release);
    }
    if (entry.code != 0) first_failed_ = std::min(first_failed_, entry.op_seq);
    if (auto it = results_.find(entry.op_seq); it != results_.end()) {
      if (entry.code == 0 && (entry.result_flags & kResultHealth)) {
        it->second->has_health = true;
        it->second->found_inf = entry.found_inf != 0;
        it->second->sq_norm = entry.sq_norm;
      }
      results_.erase(it);
    }
    pending_.erase(entry.op_seq);
    latency_bound_.erase(entry.op_seq);
  }
  if (failure_.ok() && !published.ok()) fail_all_locked(published);
}

void Completions::fail_all_locked(const Status& status) {
  if (failure_.ok()) failure_ = cause(status);
  failed_.store(true, std::memory_order_release);
  if (!pending_.empty()) first_failed_ = std::min(first_failed_, *pending_.begin());
  pending_.clear();
  latency_bound_.clear();
  results_.clear();
}

bool Completions::check_liveness_locked() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_liveness_check_) return true;
  next_liveness_check_ = now + kLivenessInterval;
  const Status gone = daemon_gone_();
  if (gone.ok()) return true;
  drain_locked();  // completions posted before the daemon went away still count
  if (failure_.ok() || !pending_.empty()) fail_all_locked(gone);
  return false;
}

bool Completions::poll(uint64_t seq, Status* status) {
  MutexLock lock(mutex_);
  drain_locked();
  if (pending_.count(seq)) return false;
  *status = outcome_locked(seq);
  return true;
}

bool Completions::wait(uint64_t seq, std::chrono::steady_clock::time_point deadline, Status* status) {
  for (;;) {
    Polling polling;
    {
      MutexLock lock(mutex_);
      drain_locked();
      if (!pending_.count(seq)) {
        *status = outcome_locked(seq);
        return true;
      }
      if (!check_liveness_locked()) continue;
      polling = latency_bound_.count(seq) ? kLatencyBoundPolling : kPolling;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto slice = std::min(deadline, now + kLivenessInterval);
    completion_ready().wait_until(
        [&] { return has_entries() || channel_->daemon()->failure_code.load(std::memory_order_acquire) != 0; }, slice,
        polling);
  }
}

void Completions::wait_below(size_t limit, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    {
      MutexLock lock(mutex_);
      drain_locked();
      if (pending_.size() < limit) return;
      check_liveness_locked();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw Error(Status::timeout("more than " + std::to_string(limit) + " operations are pending and none completed " +
                                  "before the job timeout"));
    }
    completion_ready().wait_until([&] { return has_entries(); }, std::min(deadline, now + kLivenessInterval));
  }
}

Status Completions::job_failure() {
  // mark_ready asks this once per tensor: without a recorded failure, a published one or an
  // undrained completion, the answer is ok without taking the lock. Sound because the daemon
  // publishes a job's failure_code before it posts the failed completions (Worker::shut_down):
  // if another thread already drained a failed entry, failure_code is visible here too.
  if (!failed_.load(std::memory_order_acquire) && !has_entries() &&
      channel_->daemon()->failure_code.load(std::memory_order_acquire) == 0) {
    return Status();
  }
  MutexLock lock(mutex_);
  drain_locked();
  return failure_;
}

Status Completions::health() {
  if (Status failed = job_failure(); !failed.ok()) return failed;
  return daemon_gone_ ? daemon_gone_() : Status();
}

// Work is a thin handle on Completions.

bool Work::is_completed() const {
  if (!completions_) return true;
  Status status;
  if (!completions_->poll(seq_, &status)) return false;
  if (!status.ok() || !events_) return true;
  bool done = false;
  const Status polled = events_->host_wait_done(seq_, std::chrono::steady_clock::now(), &done);
  return done || !polled.ok();
}

bool Work::wait(std::chrono::milliseconds timeout) const {
  if (!completions_) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status status;
  if (!completions_->wait(seq_, deadline, &status)) return false;
  throw_if_error(status);
  if (!events_) return true;
  // The daemon answered once the work was queued: the results are there when its done event
  // is. Polled in slices, so that a job that fails meanwhile (a stream the daemon had to give
  // up on, a daemon that died) is reported rather than waited out.
  for (;;) {
    bool done = false;
    const auto slice = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
    throw_if_error(events_->host_wait_done(seq_, slice, &done));
    if (done) return true;
    throw_if_error(completions_->health());
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

bool Work::wait_stream(void* stream, std::chrono::milliseconds timeout) const {
  if (!events_) return wait(timeout);
  Status status;
  if (!completions_->wait(seq_, std::chrono::steady_clock::now() + timeout, &status)) return false;
  throw_if_error(status);
  throw_if_error(events_->wait_done(seq_, stream));
  return true;
}

OpResult Work::result(const char* what) const {
  if (!result_) {
    throw Error(Status::invalid_argument(std::string(what) + ": the operation did not ask for it (ReduceOptions::health)"));
  }
  Status status;
  if (!completions_->poll(seq_, &status)) {
    throw Error(Status::invalid_argument(std::string(what) + ": the operation has not completed; wait for it first"));
  }
  throw_if_error(status);
  // Written before the operation counted as completed, under the same lock.
  if (!result_->has_health) throw Error(Status::internal(std::string(what) + ": the daemon sent no health"));
  return *result_;
}

bool Work::found_inf() const { return result("found_inf").found_inf; }

double Work::sq_norm() const { return result("sq_norm").sq_norm; }

Status Work::error() const {
  if (!completions_) return Status();
  Status status;
  completions_->poll(seq_, &status);
  return status;
}

}  // namespace gradsync
