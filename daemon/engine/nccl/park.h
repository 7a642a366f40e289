// CommPark: the communicators of an engine whose job ended while they were healthy and idle,
// kept for the job's next generation. A trainer that crashes and restarts (torchrun's elastic
// restart) re-joins the same job with the same layout; its engine then takes the parked
// communicators instead of paying NCCL's bootstrap and connection setup again.
//
// Reuse is safe only when every rank of the communicator is at the same point, so the engine
// offers a parked entry to the other nodes (the unique id it was made with, and how many
// collectives were issued on it, all of them finished) and reuses it only when every node that
// brings GPUs offers the same; otherwise every node discards its entry and creates fresh ones.
// Communicators with work that may not have finished are never parked: they are aborted.
//
// Entries are kept for `keep` and at most `capacity` of them: they hold GPU memory and network
// connections. A sweeper thread aborts each when it expires, and the destructor (the daemon
// exits) all of them. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/nccl/api.h"
#include "daemon/engine/nccl/store.h"
#include "shared/mutex.h"

namespace gradsync::nccl {

struct ParkedComms {
  std::string key;           // the job, the engine's name, this node's GPUs and slots
  RankPlan plan;             // as agreed when they were made
  UniqueId id{};             // the unique id they were made with
  uint64_t collectives = 0;  // issued on them, every one finished
  std::vector<void*> comms;  // one per local GPU, in the engine's order
  std::chrono::steady_clock::time_point since;
};

class CommPark {
 public:
  CommPark(NcclApi* api, std::chrono::milliseconds keep, size_t capacity = 16);
  ~CommPark();  // stops the sweeper, aborts every parked communicator
  CommPark(const CommPark&) = delete;
  CommPark& operator=(const CommPark&) = delete;

  bool enabled() const { return keep_.count() > 0 && capacity_ > 0; }
  // Keeps `entry`: the caller (an engine, under its own calls mutex) hands the communicators
  // over, idle, their registrations already ended. When disabled, or beyond the capacity, the
  // oldest go.
  void park_locked(ParkedComms entry);
  // Takes the entry under `key`, if any is still fresh. Expired entries are aborted here.
  std::optional<ParkedComms> take(const std::string& key);
  // Aborts an entry's communicators (one that was taken but is not reused).
  void discard(ParkedComms entry);

  size_t size() const;

 private:
  // Aborts the communicators. A parked entry is the park's alone, and idle: no other thread
  // can be inside NCCL on them, so no lock is needed.
  void abort_entry(ParkedComms& entry);
  // Removes expired entries into *out; under mutex_.
  void sweep(std::vector<ParkedComms>* out) GS_REQUIRES(mutex_);
  // The sweeper thread: aborts entries as they expire.
  void run();

  NcclApi* api_;
  const std::chrono::milliseconds keep_;
  const size_t capacity_;
  mutable Mutex mutex_;  // never held across an NCCL call
  CondVar wake_;
  std::deque<ParkedComms> entries_ GS_GUARDED_BY(mutex_);  // oldest first, so the front expires first
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  std::thread sweeper_;  // last: started once the rest is built
};

}  // namespace gradsync::nccl
