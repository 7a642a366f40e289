// The CUDA executor: buckets of sets in device memory, for sets whose local participants all
// live on one GPU (clients sharing a GPU). Per bucket, on the daemon's stream for that GPU:
//   allreduce  gather (every participant, rank order) -> scatter (every participant)
//   reduce     gather (every participant) -> scatter (the root only)
//   broadcast  gather (the root alone: a copy) -> scatter (everybody else)
// The launch tables (segments, work items) are built and uploaded once per (set, bucket, kind
// of launch) and reused every step; the bucket buffer grows to the largest bucket and stays.
//
// Ordering, for now, through the host: the client synchronises its stream before it marks a
// tensor ready, and the executor synchronises its stream before it answers, so completions mean
// the results are in memory. The interprocess event rings (events.h) replace both host waits
// next.
//
// Not yet: buckets whose group spans GPUs or nodes (the NCCL engine), and allgather on device
// sets. Both are refused with an error naming them.
#pragma once

#include <map>
#include <mutex>
#include <tuple>

#include "daemon/backend/cuda/device_api.h"
#include "daemon/backend/cuda/launcher.h"
#include "daemon/backend/executor.h"
#include "daemon/util/log.h"

namespace gradsync::cuda {

class CudaExecutor final : public BucketExecutor {
 public:
  CudaExecutor(DeviceApi* api, KernelLauncher* kernels, Logger log);
  ~CudaExecutor() override;  // frees the tables, the bucket buffers and the streams
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Runs on the caller's thread and answers before returning (see the ordering note above).
  void launch(BucketCall call, BucketDone done) override;
  void abort(const Status& why) override;

 private:
  // One launch's table in device memory.
  struct Table {
    void* segments = nullptr;
    void* items = nullptr;
    uint64_t item_count = 0;
    uint32_t clients = 0;
  };
  enum class Side { kGather, kScatter };
  // (set id, bucket, side, the one client of a root-only launch or -1, the root it skips or -1,
  // whether it counts bytes rather than elements)
  using TableKey = std::tuple<uint32_t, size_t, Side, int, int, bool>;
  struct Device {
    void* stream = nullptr;
    void* bucket_buffer = nullptr;
    size_t bucket_bytes = 0;
  };

  Status run(const BucketCall& call);
  Status device_of(const TensorSet& set, size_t bucket, int* device) const;
  Status device_state(int device, size_t bucket_bytes, Device** out);
  // The table of `clients` (local ranks) for one side of a bucket, uploaded on first use.
  Status table(const BucketCall& call, int device, Side side, int only, bool skip_root, bool bytes,
               const Table** out);

  DeviceApi* api_;
  KernelLauncher* kernels_;
  Logger log_;
  std::mutex mutex_;
  Status aborted_;  // guarded by mutex_
  // Caller's thread only (the worker launches one bucket at a time).
  std::map<int, Device> devices_;
  std::map<TableKey, std::pair<int, Table>> tables_;  // with the device they live on
};

}  // namespace gradsync::cuda
