// The real DeviceApi: the CUDA runtime. Every call names the device it is for, because the
// daemon drives several GPUs from its threads and the runtime's current device is per thread.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/backend/cuda/device_api.h"
#include "shared/mutex.h"

namespace gradsync::cuda {
namespace {

Status check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status();
  return Status::internal(std::string(what) + ": " + cudaGetErrorString(error));
}

// Errors that leave the context unusable for every later call (CUDA runtime API, "sticky"
// errors: a kernel that faulted). cudaErrorLaunchTimeout and the ECC error are sticky too.
bool sticky(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorContextIsDestroyed:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

// The device this thread made current through make_current(), or -1. (cudaGetDevice says 0
// on a thread that never chose one, and setting 0 back would create GPU 0's context, about
// half a GiB, on a daemon that may not use GPU 0 at all.)
thread_local int chosen_device = -1;

// Makes `device` current for one call and puts the thread's chosen device back, so a call for
// one GPU never leaves a later launch on another GPU's stream pointing at the wrong device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    previous_ = chosen_device;
    status_ = check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

// The driver calls the runtime has no equivalent for (virtual memory import), fetched through
// the runtime, so the daemon links no libcuda and starts on machines without one.
struct DriverCalls {
  decltype(&::cuMemImportFromShareableHandle) import = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemGetAddressRange) address_range = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  Status status;
};

Status fetch(const char* symbol, void** slot) {
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t error = cudaGetDriverEntryPointByVersion(symbol, slot, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || *slot == nullptr) {
    return Status::not_supported(std::string("the CUDA driver lacks ") + symbol);
  }
  return Status();
}

// The other GPUs that can reach `device`'s memory directly (peer access).
std::vector<int> peers_of(int device) {
  std::vector<int> peers;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return peers;
  for (int peer = 0; peer < count; ++peer) {
    int reachable = 0;
    if (peer != device && cudaDeviceCanAccessPeer(&reachable, peer, device) == cudaSuccess && reachable) {
      peers.push_back(peer);
    }
  }
  return peers;
}

Status driver_check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return Status();
  return Status::internal(std::string(what) + " failed with CUDA driver error " + std::to_string(static_cast<int>(result)));
}

bool driver_sticky(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_EXTERNAL_DEVICE:
      return true;
    default:
      return false;
  }
}

class CudaDeviceApi final : public DeviceApi {
 public:
  Status device_of_uuid(const std::string& uuid, int* device) override {
    int count = 0;
    if (Status s = check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s.ok()) return s;
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp props{};
      if (cudaGetDeviceProperties(&props, d) != cudaSuccess) continue;
      if (uuid.size() == sizeof(props.uuid.bytes) && std::memcmp(props.uuid.bytes, uuid.data(), uuid.size()) == 0) {
        *device = d;
        return Status();
      }
    }
    return Status::not_found("no GPU with the client's UUID is visible to gradsyncd (it sees " + std::to_string(count) +
                             "; check CUDA_VISIBLE_DEVICES of the daemon's service)");
  }

  Status import_vmm(int device, int fd, uint64_t* handle, int* located) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    CUmemGenericAllocationHandle imported = 0;
    if (Status s = driver_call(device, d.import(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                               "cuMemImportFromShareableHandle");
        !s.ok()) {
      return s;
    }
    CUmemAllocationProp prop{};
    if (Status s = driver_call(device, d.properties(&prop, imported), "cuMemGetAllocationPropertiesFromHandle");
        !s.ok()) {
      d.release(imported);
      return s;
    }
    *located = prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop.location.id : -1;
    *handle = imported;
    return Status();
  }

  Status release_vmm_handle(int device, uint64_t handle) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    return driver_call(device, d.release(handle), "cuMemRelease");
  }

  Status map_vmm(int device, uint64_t handle, size_t bytes, void** address) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t granularity = 0;
    CUdeviceptr mapped = 0;
    Status s = driver_call(device, d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                           "cuMemGetAllocationGranularity");
    if (s.ok() && bytes % granularity != 0) {
      s = Status::invalid_argument(std::to_string(bytes) + " bytes is not a multiple of the allocation granularity (" +
                                   std::to_string(granularity) + ")");
    }
    if (s.ok()) s = driver_call(device, d.reserve(&mapped, bytes, granularity, 0, 0), "cuMemAddressReserve");
    if (s.ok()) {
      s = driver_call(device, d.map(mapped, bytes, 0, handle, 0), "cuMemMap");
      if (!s.ok()) d.free(mapped, bytes);
    }
    if (s.ok()) {
      // This GPU, and every GPU that can reach it: NCCL's P2P transport may read or write a
      // peer's registered buffer directly when one process drives both GPUs.
      std::vector<CUmemAccessDesc> access(1);
      access[0].location = prop.location;
      access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      for (int peer : peers_of(device)) {
        CUmemAccessDesc more{};
        more.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        more.location.id = peer;
        more.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access.push_back(more);
      }
      // With the peers if they can be granted, else this GPU alone (a peer in MIG mode, or
      // broken): NCCL then copies through its own buffers for that peer.
      CUresult granted = d.set_access(mapped, bytes, access.data(), access.size());
      if (granted != CUDA_SUCCESS && access.size() > 1) granted = d.set_access(mapped, bytes, access.data(), 1);
      s = driver_call(device, granted, "cuMemSetAccess");
      if (!s.ok()) {
        d.unmap(mapped, bytes);
        d.free(mapped, bytes);
      }
    }
    if (!s.ok()) return s;
    *address = reinterpret_cast<void*>(mapped);
    return Status();
  }

  // The caller unmaps only once nothing queued on its job's streams can touch the memory
  // (the executor holds a bucket's set until its GPU work is through).
  Status release_vmm(int device, void* address, size_t bytes, uint64_t handle) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    const auto p = reinterpret_cast<CUdeviceptr>(address);
    Status s = driver_call(device, d.unmap(p, bytes), "cuMemUnmap");
    d.free(p, bytes);
    d.release(handle);
    return s;
  }

  Status allocation_size(int device, void* base, size_t* bytes) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    CUdeviceptr start = 0;
    return driver_call(device, d.address_range(&start, bytes, reinterpret_cast<CUdeviceptr>(base)),
                       "cuMemGetAddressRange");
  }

  Status open_ipc_memory(int device, const IpcHandle& handle, void** base) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaIpcMemHandle_t h;
    static_assert(sizeof(h) == sizeof(IpcHandle));
    std::memcpy(&h, handle.data(), sizeof(h));
    if (Status s = call(device, cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
        !s.ok()) {
      return s;
    }
    // The flag would map an allocation of another GPU through peer access: the memory must be
    // on the GPU the client named, which is the one the executor launches on.
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, *base) != cudaSuccess || attributes.device != device) {
      const int actual = attributes.device;
      cudaIpcCloseMemHandle(*base);
      *base = nullptr;
      return Status::invalid_argument("the IPC handle names memory on GPU " + std::to_string(actual) + ", not on GPU " +
                                      std::to_string(device) + " as the client said");
    }
    return Status();
  }
  Status close_ipc_memory(int device, void* base) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }
  Status create_ipc_event(int device, void** event, IpcHandle* handle) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaEvent_t created = nullptr;
    Status s = call(device, cudaEventCreateWithFlags(&created, cudaEventInterprocess | cudaEventDisableTiming),
                     "cudaEventCreateWithFlags (interprocess)");
    if (!s.ok()) return s;
    cudaIpcEventHandle_t h;
    static_assert(sizeof(h) == sizeof(IpcHandle));
    if (s = call(device, cudaIpcGetEventHandle(&h, created), "cudaIpcGetEventHandle"); !s.ok()) {
      cudaEventDestroy(created);
      return s;
    }
    std::memcpy(handle->data(), &h, sizeof(h));
    *event = created;
    return Status();
  }
  Status destroy_event(int device, void* event) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }
  Status create_event(int device, void** event) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaEvent_t created = nullptr;
    Status s = call(device, cudaEventCreateWithFlags(&created, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    *event = created;
    return s;
  }
  Status query_event(int device, void* event, bool* done) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    const cudaError_t result = cudaEventQuery(static_cast<cudaEvent_t>(event));
    *done = result == cudaSuccess;
    // The runtime keeps "not ready" as the thread's last error too, and the next kernel
    // launch's cudaGetLastError would report it as a launch failure: clear it (PyTorch does).
    if (result == cudaErrorNotReady) (void)cudaGetLastError();
    if (result == cudaSuccess || result == cudaErrorNotReady) return Status();
    return call(device, result, "cudaEventQuery");
  }
  Status make_current(int device) override {
    Status s = call(device, cudaSetDevice(device), "cudaSetDevice");
    if (s.ok()) chosen_device = device;
    return s;
  }

  Status allocate(int device, size_t bytes, void* stream, void** memory) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaMemPool_t pool = nullptr;
    if (Status s = pool_of(device, &pool); !s.ok()) return s;
    return call(device, cudaMallocFromPoolAsync(memory, bytes, pool, static_cast<cudaStream_t>(stream)),
                "cudaMallocFromPoolAsync");
  }
  Status free(int device, void* memory, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaFreeAsync(memory, static_cast<cudaStream_t>(stream)), "cudaFreeAsync");
  }
  Status upload(int device, void* to, const void* from, size_t bytes, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    // From pageable memory the runtime stages the bytes before it returns, so `from` may go;
    // the copy itself runs in the stream's order, after the allocation it writes into.
    return call(device, cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
                "cudaMemcpyAsync");
  }
  Status download(int device, void* to, const void* from, size_t bytes, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    Status s = call(device,
                    cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
                    "cudaMemcpyAsync");
    if (s.ok()) s = call(device, cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
    return s;
  }
  Status zero(int device, void* at, size_t bytes, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaMemsetAsync(at, 0, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
  }
  Status create_stream(int device, void** stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaStream_t created = nullptr;
    Status s = call(device, cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    *stream = created;
    return s;
  }
  Status destroy_stream(int device, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
  }
  Status trim(int device) override {
    cudaMemPool_t pool = nullptr;
    {
      MutexLock lock(pools_mutex_);
      auto it = pools_.find(device);
      if (it == pools_.end()) return Status();
      pool = it->second;
    }
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
  }
  Status synchronize(int device, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }

  Status stream_wait_event(int device, void* stream, void* event) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
                "cudaStreamWaitEvent");
  }
  Status record_event(int device, void* event, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return call(device, cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
                "cudaEventRecord");
  }

  // Also probes: a sticky error first seen outside this api (a kernel launch, inside NCCL)
  // fails every later call, cudaMemGetInfo included, which neither waits nor launches.
  Status health(int device) override {
    {
      MutexLock lock(broken_mutex_);
      if (auto it = broken_.find(device); it != broken_.end()) return it->second;
    }
    DeviceScope scope(device);
    if (!scope.status().ok()) return Status();  // cannot probe `device`; nothing known against it
    size_t free_bytes = 0, total_bytes = 0;
    (void)call(device, cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    MutexLock lock(broken_mutex_);
    auto it = broken_.find(device);
    return it == broken_.end() ? Status() : it->second;
  }

 private:
  // The daemon's own memory pool on `device`, made on first use. Not the device's default
  // pool: with its defaults, a cudaMallocAsync of one job may be handed memory another job
  // freed on its stream, with a dependency on that stream's work (a hung collective), and it
  // gives memory back at every synchronisation. Here: no reuse behind another stream's
  // dependencies, nothing given back (the pool holds bucket buffers and tables, which jobs keep
  // for their life), and every GPU that can reach it may (NCCL's P2P may read a peer's buffer
  // directly when one process drives both GPUs).
  Status pool_of(int device, cudaMemPool_t* out) {
    MutexLock lock(pools_mutex_);
    if (auto it = pools_.find(device); it != pools_.end()) {
      *out = it->second;
      return Status();
    }
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (Status s = call(device, cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate"); !s.ok()) return s;
    int no = 0;
    uint64_t keep = UINT64_MAX;
    Status s = call(device, cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no),
                    "cudaMemPoolSetAttribute");
    if (s.ok()) {
      s = call(device, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
               "cudaMemPoolSetAttribute");
    }
    if (s.ok()) {
      for (int peer : peers_of(device)) {
        cudaMemAccessDesc access{};
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = peer;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        // A peer NCCL will treat as reachable must be able to reach this memory, or its first
        // direct access faults the context: a grant that fails fails the pool, loudly.
        if (const cudaError_t e = cudaMemPoolSetAccess(pool, &access, 1); e != cudaSuccess) {
          s = Status::internal("GPU " + std::to_string(device) + "'s memory pool: granting GPU " +
                               std::to_string(peer) + " access failed: " + cudaGetErrorString(e));
          (void)cudaGetLastError();
          break;
        }
      }
    }
    if (!s.ok()) {
      cudaMemPoolDestroy(pool);
      return s;
    }
    pools_.emplace(device, pool);
    *out = pool;
    return Status();
  }

  // A failed call's error; a sticky one also becomes the device's health for good.
  Status call(int device, cudaError_t error, const char* what) {
    if (error == cudaSuccess) return Status();
    const Status status = check(error, what);
    if (sticky(error)) mark_broken(device, status);
    return status;
  }
  Status driver_call(int device, CUresult result, const char* what) {
    if (result == CUDA_SUCCESS) return Status();
    const Status status = driver_check(result, what);
    if (driver_sticky(result)) mark_broken(device, status);
    return status;
  }
  void mark_broken(int device, const Status& why) {
    MutexLock lock(broken_mutex_);
    broken_.emplace(device, Status::internal("GPU " + std::to_string(device) +
                                             " is unusable: a sticky CUDA error broke gradsyncd's context on it (" +
                                             why.message() + "); only a restart of gradsyncd recovers it"));
  }

  const DriverCalls& driver() {
    std::call_once(fetched_, [&] {
      Status& s = calls_.status;
      if (s.ok()) s = fetch("cuMemImportFromShareableHandle", reinterpret_cast<void**>(&calls_.import));
      if (s.ok()) s = fetch("cuMemAddressReserve", reinterpret_cast<void**>(&calls_.reserve));
      if (s.ok()) s = fetch("cuMemAddressFree", reinterpret_cast<void**>(&calls_.free));
      if (s.ok()) s = fetch("cuMemMap", reinterpret_cast<void**>(&calls_.map));
      if (s.ok()) s = fetch("cuMemUnmap", reinterpret_cast<void**>(&calls_.unmap));
      if (s.ok()) s = fetch("cuMemSetAccess", reinterpret_cast<void**>(&calls_.set_access));
      if (s.ok()) s = fetch("cuMemRelease", reinterpret_cast<void**>(&calls_.release));
      if (s.ok()) s = fetch("cuMemGetAddressRange", reinterpret_cast<void**>(&calls_.address_range));
      if (s.ok()) s = fetch("cuMemGetAllocationGranularity", reinterpret_cast<void**>(&calls_.granularity));
      if (s.ok()) {
        s = fetch("cuMemGetAllocationPropertiesFromHandle", reinterpret_cast<void**>(&calls_.properties));
      }
    });
    return calls_;
  }

  std::once_flag fetched_;
  DriverCalls calls_;
  Mutex broken_mutex_;
  std::map<int, Status> broken_ GS_GUARDED_BY(broken_mutex_);  // devices a sticky error broke
  Mutex pools_mutex_;
  std::map<int, cudaMemPool_t> pools_ GS_GUARDED_BY(pools_mutex_);  // live as long as the daemon
};

}  // namespace

std::unique_ptr<DeviceApi> make_cuda_device_api() { return std::make_unique<CudaDeviceApi>(); }

}  // namespace gradsync::cuda
