// Where one bucket's execution time went, as its executor measured it, for the admin service's
// statistics and trace. Written by the executor before it answers the bucket, read by the
// worker after the answer (the answer orders the two).
#pragma once

#include <chrono>

namespace gradsync {

struct BucketTimings {
  bool reported = false;     // the executor filled it in (host executors do; device ones not yet)
  bool cross_node = false;   // the bucket went through a collective across nodes
  std::chrono::nanoseconds peers{0};       // the sequence check: until every node reached it
  std::chrono::nanoseconds collective{0};  // inside the engine's collective calls
  std::chrono::nanoseconds local{0};       // combining, scaling, copies and fan-out on this node
  // The payload this node handed to the engine's collectives for the bucket (a masked set's
  // kept elements only; half of it with wire compression). What the algorithm sends on the
  // links is a multiple of it that depends on the node count (a ring's 2(n-1)/n).
  uint64_t carried_bytes = 0;
};

// Adds the time from construction to destruction to a duration: for the executor's phases.
class PhaseTimer {
 public:
  explicit PhaseTimer(std::chrono::nanoseconds* into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    if (into_) *into_ += std::chrono::steady_clock::now() - start_;
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  std::chrono::nanoseconds* into_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace gradsync
