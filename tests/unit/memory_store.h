// A rendezvous store over a map in this process, for tests that drive what the daemon does with
// one (daemon/peer/rendezvous_store.h): get() waits for its keys as the real stores do; a test
// may answer add() with a count of its choosing, see every write (on_set) and count the bytes
// every reader took (bytes_read).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/peer/rendezvous_store.h"

namespace gradsync {

// The whole store interface over a map. get() waits for its keys; add() answers `count_answer`
// when one is given; on_set() sees every write and may add keys of its own.
class MemoryStore final : public RendezvousStore {
 public:
  std::string describe() const override { return "the test's store"; }
  Status set(const std::string& job, const std::string& key, const std::string& value,
             std::chrono::milliseconds) override {
    std::function<void(const std::string&, const std::string&)> hook;
    {
      std::lock_guard lock(mutex_);
      keys_[job + "/" + key] = value;
      hook = on_set;
    }
    if (hook) hook(key, value);
    changed_.notify_all();
    return Status();
  }
  Status set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                       std::chrono::milliseconds timeout, bool* stored) override {
    {
      std::lock_guard lock(mutex_);
      *stored = !keys_.count(job + "/" + key);
    }
    return *stored ? set(job, key, value, timeout) : Status();
  }
  Status get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
             std::vector<std::string>* values) override {
    std::unique_lock lock(mutex_);
    const auto all_there = [&] {
      for (const auto& key : keys) {
        if (!keys_.count(job + "/" + key)) return false;
      }
      return true;
    };
    if (!changed_.wait_for(lock, timeout, all_there)) return Status::timeout("keys not there");
    values->clear();
    for (const auto& key : keys) values->push_back(keys_.at(job + "/" + key));
    return Status();
  }
  Status add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds,
             int64_t* value) override {
    std::lock_guard lock(mutex_);
    *value = count_answer ? *count_answer : (counters_[job + "/" + key] += delta);
    return Status();
  }
  Status delete_job(const std::string&, std::chrono::milliseconds, const std::string&) override { return Status(); }
  void cancel(const Status&) override {}
  std::shared_ptr<RendezvousStore> fresh() const override { return nullptr; }

  // Writes a key as another node would (no hook).
  void put(const std::string& job, const std::string& key, const std::string& value) {
    {
      std::lock_guard lock(mutex_);
      keys_[job + "/" + key] = value;
    }
    changed_.notify_all();
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return keys_.size();
  }

  std::optional<int64_t> count_answer;
  std::function<void(const std::string& key, const std::string& value)> on_set;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> keys_;
  std::map<std::string, int64_t> counters_;
};

}  // namespace gradsync
