// The peer service's key-value store: keys are scoped by job, values are bytes, a get can wait
// for keys to appear. Thread-safe; gRPC threads call it concurrently.
//
// Waiting gets never block a thread: a get that cannot be answered yet is parked with its
// deadline, and answered by the set()/add() that completes it or by the expiry thread. Callbacks
// run without the store's lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shared/status.h"

namespace gradsync {

class KvStore {
 public:
  using GetDone = std::function<void(const Status&, std::vector<std::string> values)>;

  struct Limits {
    size_t max_value_bytes = 16u << 20;
    size_t max_keys_per_job = 1u << 20;
    size_t max_name_bytes = 1024;  // job ids and keys
    size_t max_jobs = 1u << 16;
  };

  explicit KvStore(Limits limits);
  KvStore() : KvStore(Limits{}) {}
  ~KvStore();  // answers every parked get with kAborted
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  Status set(const std::string& job, const std::string& key, std::string value);
  // Stores `value` only if `key` has no value yet (*stored says which); the first writer wins.
  Status set_if_absent(const std::string& job, const std::string& key, std::string value, bool* stored);

  // Adds delta to the counter at key (absent counts as 0) and stores the decimal result.
  Status add(const std::string& job, const std::string& key, int64_t delta, int64_t* result);

  size_t delete_job(const std::string& job);

  // Answers done(ok, values) once every key exists; with timeout 0, at once with kNotFound for
  // a missing key; otherwise with kTimeout at the deadline.
  void get(const std::string& job, std::vector<std::string> keys, std::chrono::milliseconds timeout, GetDone done);

  // Answers every parked get with `status`; the store keeps working.
  void abort_all(const Status& status);

  // Answers every parked get with `status` and parks no more (server shutdown): a get that
  // arrives later is answered at once.
  void shutdown(const Status& status);

 private:
  struct Waiter {
    std::string job;
    std::vector<std::string> keys;
    std::chrono::steady_clock::time_point deadline;
    GetDone done;
  };
  using Ready = std::vector<std::pair<GetDone, std::vector<std::string>>>;

  Status check_names(const std::string& job, const std::string& key) const;
  Status slot_locked(const std::string& job, const std::string& key, std::string** slot);
  bool lookup_locked(const std::string& job, const std::vector<std::string>& keys, std::vector<std::string>* values) const;
  Ready collect_ready_locked();
  void expire_loop();

  Limits limits_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::map<std::string, std::string>> jobs_;  // guarded by mutex_
  std::list<Waiter> waiters_;                                        // guarded by mutex_
  bool stopping_ = false;                                            // guarded by mutex_
  std::thread expiry_;
};

}  // namespace gradsync
