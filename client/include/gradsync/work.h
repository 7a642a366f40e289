// The handle of a submitted operation (c10d's Work): poll it, wait for it with a timeout, read
// its error, or, on a set in device memory, order a CUDA stream after it. Copies share the same
// operation.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "shared/status.h"

namespace gradsync {

class Completions;
class DeviceEvents;

class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<Completions> completions, uint64_t seq, std::shared_ptr<DeviceEvents> events = nullptr)
      : completions_(std::move(completions)), seq_(seq), events_(std::move(events)) {}

  // True once the operation finished, successfully or not (on a device set: and the GPU is
  // through its results). Never blocks.
  bool is_completed() const;

  // Waits at most `timeout`. True when it completed successfully, false when the timeout passed
  // first; throws Error when the operation failed (the error names the rank and the cause). On
  // a device set the results are in device memory when it returns true.
  bool wait(std::chrono::milliseconds timeout) const;

  // Device sets: makes `stream` (a cudaStream_t; nullptr is the legacy default stream) wait for
  // the results on the GPU, as torch's Stream.wait_stream does, so the optimizer step can be
  // queued before the reduction ends. The host waits only until the daemon has queued the
  // operation (its completion), at most `timeout`: false when that did not happen in time;
  // throws Error when the operation failed. Host sets: the same as wait().
  bool wait_stream(void* stream, std::chrono::milliseconds timeout) const;

  // The failure, once completed with one; ok while pending or after success.
  Status error() const;

  uint64_t seq() const { return seq_; }

 private:
  std::shared_ptr<Completions> completions_;
  uint64_t seq_ = 0;
  std::shared_ptr<DeviceEvents> events_;  // device sets only
};

}  // namespace gradsync
