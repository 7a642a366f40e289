// The backend factory: the one place that names the concrete backends (host/ now, cuda/ with
// the CUDA backend). The daemon builds one from its configuration and passes it down; the
// control plane imports client memory through it and jobs get their executors from it, so
// neither ever sees a concrete type. Tests pass fakes of the same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/backend/executor.h"
#include "daemon/model/memory.h"
#include "daemon/engine/device_engine.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_pool.h"
#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

// A buffer as a client announced it (control.proto's SegmentRequest).
struct MemoryImport {
  MemoryKind kind = MemoryKind::kHostMemfd;
  uint64_t bytes = 0;
  UniqueFd fd;              // host memfd and CUDA VMM
  std::string device_uuid;  // CUDA kinds: 16 bytes
  std::string ipc_handle;   // CUDA legacy IPC: 64 bytes
  uint64_t ipc_offset = 0;  // CUDA legacy IPC
  uint32_t uid = 0;         // the client's user (SO_PEERCRED): legacy IPC is taken from trusted users only
};

// What a job gives the executors it gets from the factory.
struct ExecutorContext {
  ThreadPool* pool = nullptr;  // the daemon's reduction pool (host work); outlives the executor
  Logger log;                  // names the job
  // Fails the job from any thread, for a failure an executor finds after it answered a bucket
  // (device work queued on a GPU that failed there). Must not block.
  std::function<void(const Status&)> fail_job;
  IntegrityCheck integrity;  // host executors
};

// Called once, the first time a sticky CUDA error breaks the daemon's context on a GPU (the
// jobs on that GPU have been failed already): the daemon exits to be restarted.
using GpuLostHandler = std::function<void(int device, const Status& why)>;

class BackendFactory {
 public:
  virtual ~BackendFactory() = default;

  // Checks and maps a buffer a client passed. The error names what is wrong (unknown kind, not
  // a memfd, missing seals, wrong size, device memory on a daemon without a usable GPU).
  virtual Status import_memory(MemoryImport what, std::shared_ptr<MemoryRegion>* out) = 0;

  // Creates a client's event rings for a device set on `device` (the GPU of its tensors).
  virtual Status create_events(int device, std::shared_ptr<const ClientEvents>* out) = 0;

  // An executor for buckets of sets whose memory is of `kind`, for one job.
  virtual Status make_executor(MemoryKind kind, const ExecutorContext& context,
                               std::unique_ptr<BucketExecutor>* out) = 0;

  // GPU work of a stopped job did not drain (BucketExecutor::quiesce said false) and may still
  // touch `memory` (a job's set, which holds its mappings): the factory keeps it mapped for as
  // long as it lives, which is the daemon's life, rather than let it be unmapped under the
  // work and fault the GPU context that every job on that GPU shares. Thread-safe.
  // The process must then end without tearing the factory down: unmapping that memory, even at
  // exit, could hang on the stuck stream or fault the GPU (daemon_main.cc ends it with _Exit
  // when keeps_undrained_memory() says so).
  virtual void keep_until_exit(std::shared_ptr<const void> memory) = 0;
  virtual bool keeps_undrained_memory() const = 0;

  // For the admin service: the memory kinds served, and the GPUs found (or why there are none).
  virtual std::vector<std::string> memory_kinds() const = 0;
  virtual std::string devices() const = 0;
};

// Probes the CUDA driver once (when built with the CUDA backend) and logs what it found: device
// memory is served only when a driver and a device are there; host memory always is.
// `device_engines` (null without NCCL) makes the NCCL engines of device sets; it outlives the
// factory.
// `legacy_ipc_uids`: the users whose legacy CUDA IPC handles are taken (--legacy-ipc-uid).
// `on_gpu_lost`: see GpuLostHandler; may be empty.
std::unique_ptr<BackendFactory> make_backend_factory(const Logger& log, DeviceEngineFactory* device_engines,
                                                     std::vector<uint32_t> legacy_ipc_uids = {},
                                                     GpuLostHandler on_gpu_lost = {});

}  // namespace gradsync
