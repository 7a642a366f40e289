#include "daemon/engine/nccl/park.h"

namespace gradsync::nccl {

CommPark::CommPark(NcclApi* api, std::chrono::milliseconds keep, size_t capacity)
    : api_(api), keep_(keep), capacity_(capacity) {
  if (enabled()) sweeper_ = std::thread([this] { run(); });
}

CommPark::~CommPark() {
  std::deque<ParkedComms> entries;
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    entries.swap(entries_);
  }
  wake_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  for (ParkedComms& entry : entries) abort_entry(entry);
}

void CommPark::abort_entry(ParkedComms& entry) {
  for (void* comm : entry.comms) {
    if (comm) api_->abort(comm);
  }
  entry.comms.clear();
}

void CommPark::sweep(std::vector<ParkedComms>* out) {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (now - it->since >= keep_) {
      out->push_back(std::move(*it));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

void CommPark::run() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    if (entries_.empty()) {
      while (!stopping_ && entries_.empty()) wake_.wait(lock);
    } else {
      wake_.wait_until(lock, entries_.front().since + keep_);
    }
    std::vector<ParkedComms> expired;
    sweep(&expired);
    if (expired.empty()) continue;
    lock.unlock();
    for (ParkedComms& e : expired) abort_entry(e);
    lock.lock();
  }
}

void CommPark::park_locked(ParkedComms entry) {
  std::vector<ParkedComms> gone;
  {
    MutexLock lock(mutex_);
    if (!enabled()) {
      gone.push_back(std::move(entry));
    } else {
      // One entry per key: a newer one replaces an older (which a job cannot be using, since
      // engines take theirs out first).
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->key == entry.key) {
          gone.push_back(std::move(*it));
          entries_.erase(it);
          break;
        }
      }
      entry.since = std::chrono::steady_clock::now();
      entries_.push_back(std::move(entry));
      sweep(&gone);
      while (entries_.size() > capacity_) {
        gone.push_back(std::move(entries_.front()));
        entries_.pop_front();
      }
    }
  }
  wake_.notify_all();  // the sweeper learns of the new expiry
  for (ParkedComms& e : gone) abort_entry(e);
}

std::optional<ParkedComms> CommPark::take(const std::string& key) {
  std::vector<ParkedComms> expired;
  std::optional<ParkedComms> found;
  {
    MutexLock lock(mutex_);
    sweep(&expired);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->key == key) {
        found = std::move(*it);
        entries_.erase(it);
        break;
      }
    }
  }
  for (ParkedComms& e : expired) abort_entry(e);
  return found;
}

void CommPark::discard(ParkedComms entry) { abort_entry(entry); }

size_t CommPark::size() const {
  MutexLock lock(mutex_);
  return entries_.size();
}

}  // namespace gradsync::nccl
