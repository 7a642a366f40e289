// The real DeviceApi: the CUDA runtime. Every call names the device it is for, because the
// daemon drives several GPUs from its threads and the runtime's current device is per thread.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "daemon/backend/cuda/device_api.h"

namespace gradsync::cuda {
namespace {

Status check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status();
  return Status::internal(std::string(what) + ": " + cudaGetErrorString(error));
}

// Makes `device` current for one call and puts the thread's previous device back, so a call for
// one GPU never leaves a later launch on another GPU's stream pointing at the wrong device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
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

class CudaDeviceApi final : public DeviceApi {
 public:
  Status open_ipc_memory(int device, const IpcHandle& handle, void** base) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaIpcMemHandle_t h;
    static_assert(sizeof(h) == sizeof(IpcHandle));
    std::memcpy(&h, handle.data(), sizeof(h));
    return check(cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  }
  Status close_ipc_memory(int device, void* base) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return check(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }
  Status open_ipc_event(int device, const IpcHandle& handle, void** event) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    cudaIpcEventHandle_t h;
    static_assert(sizeof(h) == sizeof(IpcHandle));
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t opened = nullptr;
    Status s = check(cudaIpcOpenEventHandle(&opened, h), "cudaIpcOpenEventHandle");
    *event = opened;
    return s;
  }
  Status destroy_event(int device, void* event) override {
    DeviceScope scope(device);
    if (!scope.status().ok()) return scope.status();
    return check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }
  Status stream_wait_event(void* stream, void* event) override {
    return check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
                 "cudaStreamWaitEvent");
  }
  Status record_event(void* event, void* stream) override {
    return check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
};

}  // namespace

std::unique_ptr<DeviceApi> make_cuda_device_api() { return std::make_unique<CudaDeviceApi>(); }

}  // namespace gradsync::cuda
