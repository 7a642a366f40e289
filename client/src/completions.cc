#include "client/src/completions.h"

#include <cstring>

#include "gradsync/work.h"

namespace gradsync {
namespace {

// How often a waiting client checks that the daemon is still there. The check is a poll() on
// the control socket, so it is off the per-step path unless a wait is already long.
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);

// Spinning helps only when the daemon runs on another idle core; keep it short.
constexpr int kSpin = 200;

// Completed entries kept for Work handles that have not looked yet. Old ones are forgotten
// (a Work asking about a forgotten seq reports success; it completed long ago).
constexpr size_t kMaxRemembered = 1 << 16;

}  // namespace

Completions::Completions(std::shared_ptr<ShmSegment> channel, uint32_t local_rank,
                         std::shared_ptr<Connection> connection)
    : channel_(std::move(channel)),
      header_(reinterpret_cast<ChannelHeader*>(channel_->data())),
      mine_(client_channel(channel_->data(), local_rank)),
      connection_(std::move(connection)),
      reader_(&mine_->completion) {}

// Reads only the shared atomics, so it is safe without the mutex while another thread drains.
bool Completions::has_entries() const {
  return mine_->completion.tail.load(std::memory_order_acquire) != mine_->completion.head.load(std::memory_order_acquire);
}

void Completions::expect(uint64_t seq) {
  std::lock_guard lock(mutex_);
  if (!failure_.ok()) {
    done_[seq] = failure_;
    return;
  }
  pending_[seq] = Status();
}

size_t Completions::pending() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}

void Completions::drain_locked() {
  CompletionEntry entry;
  while (reader_.try_pop(&entry) == PopResult::kOk) {
    Status status;
    if (entry.code != 0) {
      const size_t length = std::min<size_t>(entry.message_length, kCompletionMessageBytes);
      status = Status(static_cast<ErrorCode>(entry.code), std::string(entry.message, length));
    }
    pending_.erase(entry.op_seq);
    done_[entry.op_seq] = status;
  }
  while (done_.size() > kMaxRemembered) done_.erase(done_.begin());
  const uint32_t code = header_->failure_code.load(std::memory_order_acquire);
  if (code != 0 && failure_.ok()) {
    char message[sizeof(header_->failure_message) + 1] = {};
    std::memcpy(message, header_->failure_message, sizeof(header_->failure_message));
    fail_all_locked(Status(static_cast<ErrorCode>(code), message));
  }
}

void Completions::fail_all_locked(const Status& status) {
  failure_ = status;
  for (auto& [seq, unused] : pending_) done_[seq] = status;
  pending_.clear();
}

bool Completions::check_liveness_locked() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_liveness_check_) return true;
  next_liveness_check_ = now + kLivenessInterval;
  if (!connection_->peer_closed()) return true;
  drain_locked();  // completions posted before the daemon went away still count
  if (failure_.ok()) fail_all_locked(Status::peer_lost("gradsyncd at " + connection_->path() + " went away"));
  return false;
}

bool Completions::poll(uint64_t seq, Status* status) {
  std::lock_guard lock(mutex_);
  drain_locked();
  if (pending_.count(seq)) return false;
  auto it = done_.find(seq);
  *status = it == done_.end() ? Status() : it->second;
  return true;
}

bool Completions::wait(uint64_t seq, std::chrono::steady_clock::time_point deadline, Status* status) {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      drain_locked();
      if (!pending_.count(seq)) {
        auto it = done_.find(seq);
        *status = it == done_.end() ? Status() : it->second;
        return true;
      }
      if (!check_liveness_locked()) continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    const auto slice = std::min(deadline, now + kLivenessInterval);
    mine_->completion_ready.wait_until(
        [&] { return has_entries() || header_->failure_code.load(std::memory_order_acquire) != 0; }, slice, kSpin);
  }
}

void Completions::wait_below(size_t limit, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      drain_locked();
      if (pending_.size() < limit) return;
      check_liveness_locked();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw Error(Status::timeout("more than " + std::to_string(limit) + " operations are pending and none completed " +
                                  "before the job timeout"));
    }
    mine_->completion_ready.wait_until([&] { return has_entries(); }, std::min(deadline, now + kLivenessInterval));
  }
}

Status Completions::job_failure() {
  std::lock_guard lock(mutex_);
  drain_locked();
  return failure_;
}

// Work is a thin handle on Completions.

bool Work::is_completed() const {
  if (!completions_) return true;
  Status status;
  return completions_->poll(seq_, &status);
}

bool Work::wait(std::chrono::milliseconds timeout) const {
  if (!completions_) return true;
  Status status;
  if (!completions_->wait(seq_, std::chrono::steady_clock::now() + timeout, &status)) return false;
  throw_if_error(status);
  return true;
}

Status Work::error() const {
  if (!completions_) return Status();
  Status status;
  completions_->poll(seq_, &status);
  return status;
}

}  // namespace gradsync
