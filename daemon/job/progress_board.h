// Where each multi-node job of this daemon is, for other daemons that ask through the peer
// service (the admin service's GetInFlight there names the nodes that have not reached a
// collective). Jobs add their worker when they form and remove it when they end; the peer
// service's threads look them up. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/job/worker.h"
#include "shared/mutex.h"

namespace gradsync {

class ProgressBoard {
 public:
  // What the job is across nodes, for the peer store's key scope (key_scope.h).
  struct Shape {
    int nodes = 0;
    int node = 0;            // this daemon's node
    std::string rendezvous;  // as this daemon dials it
  };
  struct Entry {
    Worker::Position position;
    std::string failure;  // empty while healthy
    Shape shape;
  };

  // `key` is the job's store name, "<uid>.<job id>". A later add for the same key (the next
  // incarnation) replaces the earlier.
  void add(const std::string& key, std::weak_ptr<const Worker> worker, Shape shape) {
    MutexLock lock(mutex_);
    workers_[key] = Listed{std::move(worker), std::move(shape)};
  }
  // The job's shape, without asking its worker anything.
  std::optional<Shape> shape(const std::string& key) const {
    MutexLock lock(mutex_);
    auto it = workers_.find(key);
    if (it == workers_.end() || it->second.worker.expired()) return std::nullopt;
    return it->second.shape;
  }
  // Removes `key` if it still names `worker`.
  void remove(const std::string& key, const Worker* worker) {
    MutexLock lock(mutex_);
    auto it = workers_.find(key);
    if (it != workers_.end() && (it->second.worker.expired() || it->second.worker.lock().get() == worker)) {
      workers_.erase(it);
    }
  }
  std::optional<Entry> find(const std::string& key) const {
    std::shared_ptr<const Worker> worker;
    Shape shape;
    {
      MutexLock lock(mutex_);
      auto it = workers_.find(key);
      if (it == workers_.end()) return std::nullopt;
      worker = it->second.worker.lock();
      shape = it->second.shape;
    }
    if (!worker) return std::nullopt;
    const Status failure = worker->failure();
    return Entry{worker->position(), failure.ok() ? std::string() : failure.message(), std::move(shape)};
  }

 private:
  mutable Mutex mutex_;
  struct Listed {
    std::weak_ptr<const Worker> worker;
    Shape shape;
  };
  std::map<std::string, Listed> workers_ GS_GUARDED_BY(mutex_);
};

}  // namespace gradsync
