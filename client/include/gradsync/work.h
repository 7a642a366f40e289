// The handle of a submitted operation (c10d's Work): poll it, wait for it with a timeout, read
// its error. Copies share the same operation.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "shared/status.h"

namespace gradsync {

class Completions;

class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<Completions> completions, uint64_t seq) : completions_(std::move(completions)), seq_(seq) {}

  // True once the operation finished, successfully or not. Never blocks.
  bool is_completed() const;

  // Waits at most `timeout`. True when it completed successfully, false when the timeout passed
  // first; throws Error when the operation failed (the error names the rank and the cause).
  bool wait(std::chrono::milliseconds timeout) const;

  // The failure, once completed with one; ok while pending or after success.
  Status error() const;

  uint64_t seq() const { return seq_; }

 private:
  std::shared_ptr<Completions> completions_;
  uint64_t seq_ = 0;
};

}  // namespace gradsync
