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
struct OpResult;

class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<Completions> completions, uint64_t seq, std::shared_ptr<DeviceEvents> events = nullptr,
       std::shared_ptr<const OpResult> result = nullptr)
      : completions_(std::move(completions)), seq_(seq), events_(std::move(events)), result_(std::move(result)) {}

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

  // The fused health of an allreduce that asked for it (ReduceOptions::health), once it
  // completed successfully: whether the reduced result holds an inf or a NaN, and its sum of
  // squares in float64 (the global gradient norm squared, for clipping). The same bits on every
  // rank of the set's groups, in every run (daemon/reduce/health.h). Throws InvalidArgument
  // when the operation did not ask for it or has not completed, and the operation's error when
  // it failed.
  bool found_inf() const;
  double sq_norm() const;

  uint64_t seq() const { return seq_; }

 private:
  std::shared_ptr<Completions> completions_;
  uint64_t seq_ = 0;
  std::shared_ptr<DeviceEvents> events_;  // device sets only
  std::shared_ptr<const OpResult> result_;  // operations that asked for a result only

  OpResult result(const char* what) const;
};

}  // namespace gradsync
