#include "daemon/peer/kv_store.h"

#include <algorithm>
#include <cctype>

namespace gradsync {

KvStore::KvStore(Limits limits) : limits_(limits), expiry_([this] { expire_loop(); }) {}

KvStore::~KvStore() {
  // Stop parking first, so no get slips in between the abort and the end.
  shutdown(Status::aborted("the peer service is shutting down"));
  expiry_.join();
}

bool KvStore::lookup_locked(const std::string& job, const std::vector<std::string>& keys,
                            std::vector<std::string>* values) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  values->clear();
  for (const auto& key : keys) {
    auto found = it->second.find(key);
    if (found == it->second.end()) return false;
    values->push_back(found->second);
  }
  return true;
}

KvStore::Ready KvStore::collect_ready_locked() {
  Ready ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    std::vector<std::string> values;
    if (lookup_locked(it->job, it->keys, &values)) {
      ready.emplace_back(std::move(it->done), std::move(values));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

Status KvStore::check_names(const std::string& job, const std::string& key) const {
  if (job.size() > limits_.max_name_bytes || key.size() > limits_.max_name_bytes) {
    return Status::invalid_argument("job ids and keys are limited to " + std::to_string(limits_.max_name_bytes) +
                                    " bytes");
  }
  return Status();
}

// The slot for job/key, created if needed within the limits on jobs and keys.
Status KvStore::slot_locked(const std::string& job, const std::string& key, std::string** slot) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    if (jobs_.size() >= limits_.max_jobs) {
      return Status::resource_exhausted("the store holds " + std::to_string(jobs_.size()) + " jobs, the limit");
    }
    it = jobs_.emplace(job, std::map<std::string, std::string>{}).first;
  }
  auto& keys = it->second;
  if (keys.size() >= limits_.max_keys_per_job && !keys.count(key)) {
    return Status::resource_exhausted("job " + job + " has " + std::to_string(keys.size()) + " keys, the limit");
  }
  *slot = &keys[key];
  return Status();
}

Status KvStore::set(const std::string& job, const std::string& key, std::string value) {
  if (Status status = check_names(job, key); !status.ok()) return status;
  if (value.size() > limits_.max_value_bytes) {
    return Status::resource_exhausted("value of " + std::to_string(value.size()) + " bytes for key '" + key +
                                      "' exceeds the " + std::to_string(limits_.max_value_bytes) + "-byte limit");
  }
  Ready ready;
  {
    std::lock_guard lock(mutex_);
    std::string* slot = nullptr;
    if (Status status = slot_locked(job, key, &slot); !status.ok()) return status;
    *slot = std::move(value);
    ready = collect_ready_locked();
  }
  for (auto& [done, values] : ready) done(Status(), std::move(values));
  return Status();
}

Status KvStore::set_if_absent(const std::string& job, const std::string& key, std::string value, bool* stored) {
  *stored = false;
  {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(job);
    if (it != jobs_.end() && it->second.count(key)) return Status();
  }
  // Checked and stored under one lock below: set() would race with another writer here.
  if (Status status = check_names(job, key); !status.ok()) return status;
  if (value.size() > limits_.max_value_bytes) {
    return Status::resource_exhausted("value of " + std::to_string(value.size()) + " bytes for key '" + key +
                                      "' exceeds the " + std::to_string(limits_.max_value_bytes) + "-byte limit");
  }
  Ready ready;
  {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(job);
    if (it != jobs_.end() && it->second.count(key)) return Status();
    std::string* slot = nullptr;
    if (Status status = slot_locked(job, key, &slot); !status.ok()) return status;
    *slot = std::move(value);
    *stored = true;
    ready = collect_ready_locked();
  }
  for (auto& [done, values] : ready) done(Status(), std::move(values));
  return Status();
}

Status KvStore::add(const std::string& job, const std::string& key, int64_t delta, int64_t* result) {
  if (Status status = check_names(job, key); !status.ok()) return status;
  Ready ready;
  {
    std::lock_guard lock(mutex_);
    std::string* found = nullptr;
    if (Status status = slot_locked(job, key, &found); !status.ok()) return status;
    std::string& slot = *found;
    int64_t value = 0;
    if (!slot.empty()) {
      size_t used = 0;
      try {
        value = std::stoll(slot, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != slot.size() || std::isspace(static_cast<unsigned char>(slot[0]))) {
        return Status::invalid_argument("key '" + key + "' of job " + job + " does not hold a counter");
      }
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return Status::invalid_argument("adding " + std::to_string(delta) + " to key '" + key + "' overflows");
    }
    slot = std::to_string(value);
    *result = value;
    ready = collect_ready_locked();
  }
  for (auto& [done, values] : ready) done(Status(), std::move(values));
  return Status();
}

size_t KvStore::delete_job(const std::string& job) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  const size_t removed = it->second.size();
  jobs_.erase(it);
  return removed;
}

void KvStore::get(const std::string& job, std::vector<std::string> keys, std::chrono::milliseconds timeout,
                  GetDone done) {
  std::vector<std::string> values;
  {
    std::lock_guard lock(mutex_);
    if (!lookup_locked(job, keys, &values)) {
      if (timeout.count() > 0 && !stopping_) {
        waiters_.push_back(Waiter{job, std::move(keys), std::chrono::steady_clock::now() + timeout, std::move(done)});
        changed_.notify_all();
        return;
      }
      values.clear();
    }
  }
  if (values.size() != keys.size()) {
    done(Status::not_found("job " + job + ": key not set yet"), {});
    return;
  }
  done(Status(), std::move(values));
}

void KvStore::shutdown(const Status& status) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  abort_all(status);
}

void KvStore::abort_all(const Status& status) {
  std::list<Waiter> waiters;
  {
    std::lock_guard lock(mutex_);
    waiters.swap(waiters_);
  }
  for (auto& waiter : waiters) waiter.done(status, {});
}

void KvStore::expire_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    auto next = std::chrono::steady_clock::time_point::max();
    for (const auto& waiter : waiters_) next = std::min(next, waiter.deadline);
    if (next == std::chrono::steady_clock::time_point::max()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, next);
    }
    const auto now = std::chrono::steady_clock::now();
    std::list<Waiter> expired;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto current = it++;
      if (current->deadline <= now) expired.splice(expired.end(), waiters_, current);
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (auto& waiter : expired) {
      std::string names;
      for (const auto& key : waiter.keys) names += (names.empty() ? "" : ", ") + key;
      waiter.done(Status::timeout("job " + waiter.job + ": keys [" + names + "] were not set in time"), {});
    }
    lock.lock();
  }
}

}  // namespace gradsync
