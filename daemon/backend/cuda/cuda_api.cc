// The real DeviceApi: the CUDA runtime. Every call names the device it is for, because the
// daemon drives several GPUs from its threads and the runtime's current device is per thread.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <string>

#include "daemon/backend/cuda/device_api.h"

namespace gradsync::cuda {
namespace {

Status check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status();
  return Status::internal(std::string(what) + ": " + cudaGetErrorString(error));
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

Status driver_check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return Status();
  return Status::internal(std::string(what) + " failed with CUDA driver error " + std::to_string(static_cast<int>(result)));
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

  Status import_vmm(int device, int fd, size_t bytes, void** address, uint64_t* handle) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    CUmemGenericAllocationHandle imported = 0;
    if (Status s = driver_check(d.import(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                                "cuMemImportFromShareableHandle");
        !s.ok()) {
      return s;
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t granularity = 0;
    CUdeviceptr mapped = 0;
    Status s = driver_check(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                            "cuMemGetAllocationGranularity");
    if (s.ok() && bytes % granularity != 0) {
      s = Status::invalid_argument(std::to_string(bytes) + " bytes is not a multiple of the allocation granularity (" +
                                   std::to_string(granularity) + ")");
    }
    if (s.ok()) s = driver_check(d.reserve(&mapped, bytes, granularity, 0, 0), "cuMemAddressReserve");
    if (s.ok()) {
      s = driver_check(d.map(mapped, bytes, 0, imported, 0), "cuMemMap");
      if (!s.ok()) d.free(mapped, bytes);
    }
    if (s.ok()) {
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      s = driver_check(d.set_access(mapped, bytes, &access, 1), "cuMemSetAccess");
      if (!s.ok()) {
        d.unmap(mapped, bytes);
        d.free(mapped, bytes);
      }
    }
    if (!s.ok()) {
      d.release(imported);
      return s;
    }
    *address = reinterpret_cast<void*>(mapped);
    *handle = imported;
    return Status();
  }

  Status release_vmm(int device, void* address, size_t bytes, uint64_t handle) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    const auto p = reinterpret_cast<CUdeviceptr>(address);
    Status s = driver_check(d.unmap(p, bytes), "cuMemUnmap");
    d.free(p, bytes);
    d.release(handle);
    return s;
  }

  Status allocation_size(int device, void* base, size_t* bytes) override {
    const DriverCalls& d = driver();
    if (!d.status.ok()) return d.status;
    DeviceScope scope(device);
    CUdeviceptr start = 0;
    return driver_check(d.address_range(&start, bytes, reinterpret_cast<CUdeviceptr>(base)), "cuMemGetAddressRange");
  }

  Status open_ipc_memory(int device, const IpcHandle& handle, void** base) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaIpcMemHandle_t h;
    static_assert(sizeof(h) == sizeof(IpcHandle));
    std::memcpy(&h, handle.data(), sizeof(h));
    if (Status s = check(cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
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
    return check(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }
  Status create_ipc_event(int device, void** event, IpcHandle* handle) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaEvent_t created = nullptr;
    Status s = check(cudaEventCreateWithFlags(&created, cudaEventInterprocess | cudaEventDisableTiming),
                     "cudaEventCreateWithFlags (interprocess)");
    if (!s.ok()) return s;
    cudaIpcEventHandle_t h;
    static_assert(sizeof(h) == sizeof(IpcHandle));
    if (s = check(cudaIpcGetEventHandle(&h, created), "cudaIpcGetEventHandle"); !s.ok()) {
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
    return check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }
  Status create_event(int device, void** event) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaEvent_t created = nullptr;
    Status s = check(cudaEventCreateWithFlags(&created, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    *event = created;
    return s;
  }
  Status query_event(int device, void* event, bool* done) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    const cudaError_t result = cudaEventQuery(static_cast<cudaEvent_t>(event));
    *done = result == cudaSuccess;
    if (result == cudaSuccess || result == cudaErrorNotReady) return Status();
    return check(result, "cudaEventQuery");
  }
  Status make_current(int device) override {
    Status s = check(cudaSetDevice(device), "cudaSetDevice");
    if (s.ok()) chosen_device = device;
    return s;
  }

  Status allocate(int device, size_t bytes, void** memory) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return check(cudaMalloc(memory, bytes), "cudaMalloc");
  }
  Status free(int device, void* memory) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return check(cudaFree(memory), "cudaFree");
  }
  Status upload(int device, void* to, const void* from, size_t bytes) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    // A cudaMemcpy from pageable memory may return before the DMA is done, and the executor's
    // non-blocking stream would not wait for it: copy on the legacy stream and wait for it.
    if (Status s = check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, 0), "cudaMemcpyAsync"); !s.ok()) return s;
    return check(cudaStreamSynchronize(0), "cudaStreamSynchronize");
  }
  Status create_stream(int device, void** stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaStream_t created = nullptr;
    Status s = check(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    *stream = created;
    return s;
  }
  Status destroy_stream(int device, void* stream) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return check(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "cudaStreamDestroy");
  }
  Status synchronize(void* stream) override {
    return check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }

  Status stream_wait_event(void* stream, void* event) override {
    return check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
                 "cudaStreamWaitEvent");
  }
  Status record_event(void* event, void* stream) override {
    return check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }

 private:
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
    });
    return calls_;
  }

  std::once_flag fetched_;
  DriverCalls calls_;
};

}  // namespace

std::unique_ptr<DeviceApi> make_cuda_device_api() { return std::make_unique<CudaDeviceApi>(); }

}  // namespace gradsync::cuda
