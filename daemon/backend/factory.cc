#include "daemon/backend/factory.h"

#include <chrono>
#include <cstdio>
#include <set>

#include "daemon/backend/host/executor.h"
#include "daemon/backend/host/memory.h"
#include "daemon/backend/cuda/events.h"
#include "daemon/backend/cuda/executor.h"
#include "daemon/backend/cuda/gpu_watch.h"
#include "daemon/backend/cuda/ipc_cache.h"
#include "daemon/backend/cuda/launcher.h"
#include "daemon/backend/cuda/memory.h"
#include "shared/mutex.h"
#if GRADSYNC_HAVE_CUDA
#include "daemon/backend/cuda/device.h"
#endif

namespace gradsync {
namespace {

constexpr size_t kDeviceUuidBytes = 16;
constexpr size_t kIpcHandleBytes = 64;

// What a Segment of a CUDA kind must hold, whatever this daemon can do with it: checked first, so
// a malformed request gets the same answer on every daemon.
Status check_device_import(const MemoryImport& what) {
  const std::string kind(memory_kind_name(what.kind));
  if (what.bytes == 0) return Status::invalid_argument("a segment must not have zero bytes");
  if (what.device_uuid.size() != kDeviceUuidBytes) {
    return Status::invalid_argument(kind + " segment: device_uuid must be the GPU's " +
                                    std::to_string(kDeviceUuidBytes) + "-byte UUID, got " +
                                    std::to_string(what.device_uuid.size()) + " bytes");
  }
  if (what.kind == MemoryKind::kCudaLegacyIpc && what.ipc_handle.size() != kIpcHandleBytes) {
    return Status::invalid_argument(kind + " segment: ipc_handle must be a " + std::to_string(kIpcHandleBytes) +
                                    "-byte cudaIpcMemHandle_t, got " + std::to_string(what.ipc_handle.size()) +
                                    " bytes");
  }
  return Status();
}

class Backends final : public BackendFactory {
 public:
  // `device_problem`: why device memory cannot be served here. `devices` is the CUDA runtime
  // when it can (and null otherwise).
  Backends(std::string device_problem, std::unique_ptr<cuda::DeviceApi> devices,
           std::unique_ptr<cuda::KernelLauncher> kernels, DeviceEngineFactory* device_engines,
           std::vector<uint32_t> legacy_ipc_uids, Logger log, GpuLostHandler on_gpu_lost)
      : device_problem_(std::move(device_problem)),
        devices_(std::move(devices)),
        kernels_(std::move(kernels)),
        device_engines_(device_engines),
        legacy_ipc_uids_(legacy_ipc_uids.begin(), legacy_ipc_uids.end()),
        log_(std::move(log)),
        gpus_(std::move(on_gpu_lost)) {
    if (devices_) ipc_ = std::make_unique<cuda::IpcMemoryCache>(devices_.get());
  }

  Status import_memory(MemoryImport what, std::shared_ptr<MemoryRegion>* out) override {
    switch (what.kind) {
      case MemoryKind::kHostMemfd: return host::HostMemoryRegion::import(std::move(what.fd), what.bytes, out);
      case MemoryKind::kCudaVmm:
      case MemoryKind::kCudaLegacyIpc: {
        if (Status status = check_device_import(what); !status.ok()) return status;
        // Handle bytes are not a capability: any local user who learns them could reach
        // another user's allocation through the daemon. So legacy handles are taken only from
        // users the operator trusts (--legacy-ipc-uid), who must trust each other; VMM memory,
        // passed by descriptor, needs no such trust.
        if (what.kind == MemoryKind::kCudaLegacyIpc && !legacy_ipc_uids_.count(what.uid)) {
          return Status::permission_denied(
              "CUDA legacy IPC memory from uid " + std::to_string(what.uid) +
              " is not accepted: an IPC handle is not proof of ownership. Allocate gradients with "
              "Client::allocate_device (CUDA VMM), or have the operator trust this user with --legacy-ipc-uid " +
              std::to_string(what.uid));
        }
        if (!devices_) {
          return Status::not_supported(std::string(memory_kind_name(what.kind)) + " memory: " + device_problem_ +
                                       "; this gradsyncd serves host memory only");
        }
        const std::string kind(memory_kind_name(what.kind));
        const uint64_t bytes = what.bytes;
        const auto started = std::chrono::steady_clock::now();
        Status status = cuda::import_device_memory(devices_.get(), ipc_.get(), std::move(what), out);
        if (status.ok()) {
          // The device check's table (d) reads these lines.
          const double ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
          char line[160];
          std::snprintf(line, sizeof line, "%s segment of %llu bytes on GPU %d imported in import_ms=%.3f",
                        kind.c_str(), static_cast<unsigned long long>(bytes), (*out)->device(), ms);
          log_.info(line);
        }
        return status;
      }
    }
    return Status::invalid_argument("unknown memory kind " + std::to_string(static_cast<uint32_t>(what.kind)) +
                                    " (known: 1 host memfd, 2 CUDA VMM, 3 CUDA legacy IPC)");
  }

  Status create_events(int device, std::shared_ptr<const ClientEvents>* out) override {
    if (!devices_) return Status::not_supported("device events: " + device_problem_);
    std::unique_ptr<cuda::EventRing> ready, done;
    if (Status s = cuda::EventRing::create(devices_.get(), device, &ready); !s.ok()) return s;
    if (Status s = cuda::EventRing::create(devices_.get(), device, &done); !s.ok()) return s;
    *out = std::make_shared<cuda::ClientEventRings>(device, std::move(ready), std::move(done));
    return Status();
  }

  void describe_devices(std::string summary) { device_summary_ = std::move(summary); }

  // At start, before any job: every kernel into every GPU's context (a lazy load later could
  // synchronise a context other jobs' streams share). This makes the daemon's context on each
  // visible GPU now; CUDA_VISIBLE_DEVICES in the unit limits which.
  void preload_kernels(int devices) {
    for (int device = 0; device < devices; ++device) {
      const auto started = std::chrono::steady_clock::now();
      int loaded = 0;
      Status status = devices_->make_current(device);
      if (status.ok()) status = kernels_->preload(&loaded);
      if (!status.ok()) {
        log_.error("CUDA: GPU " + std::to_string(device) + ": " + status.message() +
                   "; its first launches will load kernels lazily");
        continue;
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
      char line[128];
      std::snprintf(line, sizeof line, "CUDA: GPU %d: %d kernels loaded in preload_ms=%.1f", device, loaded, ms);
      log_.info(line);
    }
  }

  void keep_until_exit(std::shared_ptr<const void> memory) override {
    MutexLock lock(kept_mutex_);
    kept_.push_back(std::move(memory));
  }
  bool keeps_undrained_memory() const override {
    MutexLock lock(kept_mutex_);
    return !kept_.empty();
  }

  std::vector<std::string> memory_kinds() const override {
    std::vector<std::string> kinds{std::string(memory_kind_name(MemoryKind::kHostMemfd))};
    if (devices_) {
      kinds.emplace_back(memory_kind_name(MemoryKind::kCudaVmm));
      kinds.emplace_back(memory_kind_name(MemoryKind::kCudaLegacyIpc));
    }
    return kinds;
  }
  std::string devices() const override { return devices_ ? device_summary_ : device_problem_; }

  Status make_executor(MemoryKind kind, const ExecutorContext& context,
                       std::unique_ptr<BucketExecutor>* out) override {
    switch (kind) {
      case MemoryKind::kHostMemfd:
        *out = std::make_unique<host::HostExecutor>(context.pool, context.log, context.integrity);
        return Status();
      case MemoryKind::kCudaVmm:
      case MemoryKind::kCudaLegacyIpc:
        if (!devices_ || !kernels_) break;
        *out = std::make_unique<cuda::CudaExecutor>(cuda::CudaExecutorOptions{.api = devices_.get(),
                                                                              .kernels = kernels_.get(),
                                                                              .engines = device_engines_,
                                                                              .gpus = &gpus_,
                                                                              .log = context.log,
                                                                              .fail_job = context.fail_job});
        return Status();
    }
    return Status::not_supported("no executor for " + std::string(memory_kind_name(kind)) + " memory");
  }

 private:
  const std::string device_problem_;
  std::string device_summary_;  // the probe's, when there are devices
  // Declared before the cache and outliving it and every region made here (the factory lives
  // as long as the daemon).
  std::unique_ptr<cuda::DeviceApi> devices_;
  std::unique_ptr<cuda::KernelLauncher> kernels_;
  std::unique_ptr<cuda::IpcMemoryCache> ipc_;
  DeviceEngineFactory* device_engines_;
  const std::set<uint32_t> legacy_ipc_uids_;
  Logger log_;
  cuda::GpuWatch gpus_;  // outlives the executors, which subscribe to it
  // keep_until_exit(). gradsyncd never destroys a factory that holds any (daemon_main.cc); a
  // test's factory releases them before the devices and the cache, whose regions they are.
  mutable Mutex kept_mutex_;
  std::vector<std::shared_ptr<const void>> kept_ GS_GUARDED_BY(kept_mutex_);
};

}  // namespace

std::unique_ptr<BackendFactory> make_backend_factory(const Logger& log, DeviceEngineFactory* device_engines,
                                                     std::vector<uint32_t> legacy_ipc_uids,
                                                     GpuLostHandler on_gpu_lost) {
#if GRADSYNC_HAVE_CUDA
  std::string summary;
  int count = 0;
  const Status probe = cuda::probe_devices(&summary, &count);
  if (probe.ok()) {
    log.info("CUDA: " + summary);
    auto backends = std::make_unique<Backends>("", cuda::make_cuda_device_api(), cuda::make_cuda_kernel_launcher(),
                                               device_engines, std::move(legacy_ipc_uids), log,
                                               std::move(on_gpu_lost));
    backends->describe_devices(summary);
    backends->preload_kernels(count);
    return backends;
  }
  log.info("CUDA: no usable GPU (" + probe.message() + "); serving host memory only");
  return std::make_unique<Backends>("no usable GPU here (" + probe.message() + ")", nullptr, nullptr, nullptr,
                                    std::move(legacy_ipc_uids), log, nullptr);
#else
  log.info("CUDA: built without the CUDA backend (GRADSYNC_CUDA=OFF or no nvcc/NCCL at build time); serving host memory only");
  (void)device_engines;
  (void)on_gpu_lost;
  return std::make_unique<Backends>("this gradsyncd was built without the CUDA backend (the quick start's build leaves it "
                                    "out; build with .ci/build, or cmake -DGRADSYNC_CUDA=AUTO with nvcc and NCCL)",
                                    nullptr, nullptr, nullptr,
                                    std::move(legacy_ipc_uids), log, nullptr);
#endif
}

}  // namespace gradsync
