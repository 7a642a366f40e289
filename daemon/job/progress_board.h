// Where each multi-node job of this daemon is, for other daemons that ask through the peer
// service (the admin service's GetInFlight there names the nodes that have not reached a
// collective). Jobs add their worker when they form and remove it when they end; the peer
// service's threads look them up. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "daemon/job/worker.h"

namespace gradsync {

class ProgressBoard {
 public:
  struct Entry {
    Worker::Position position;
    std::string failure;  // empty while healthy
  };

  // `key` is the job's store name, "<uid>.<job id>". A later add for the same key (the next
  // incarnation) replaces the earlier.
  void add(const std::string& key, std::weak_ptr<const Worker> worker) {
    std::lock_guard lock(mutex_);
    workers_[key] = std::move(worker);
  }
  // Removes `key` if it still names `worker`.
  void remove(const std::string& key, const Worker* worker) {
    std::lock_guard lock(mutex_);
    auto it = workers_.find(key);
    if (it != workers_.end() && (it->second.expired() || it->second.lock().get() == worker)) workers_.erase(it);
  }
  std::optional<Entry> find(const std::string& key) const {
    std::shared_ptr<const Worker> worker;
    {
      std::lock_guard lock(mutex_);
      auto it = workers_.find(key);
      if (it == workers_.end()) return std::nullopt;
      worker = it->second.lock();
    }
    if (!worker) return std::nullopt;
    const Status failure = worker->failure();
    return Entry{worker->position(), failure.ok() ? std::string() : failure.message()};
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::weak_ptr<const Worker>> workers_;  // guarded by mutex_
};

}  // namespace gradsync
