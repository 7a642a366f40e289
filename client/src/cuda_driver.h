// The CUDA driver as the client library uses it: loaded with dlopen("libcuda.so.1") on first
// use, so a trainer that uses host memory alone needs no CUDA installed. Shared by the VMM
// allocator (cuda_vmm.cc) and the interprocess events (cuda_events.cc).
#pragma once

#include <cuda.h>

#include <string>

#include "shared/status.h"

namespace gradsync {

// The driver entry points, resolved once. Names are the exported (versioned) symbols that
// cuda.h's macros map the plain names to.
struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetUuid) device_get_uuid = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release = nullptr;
  decltype(&::cuCtxPushCurrent) ctx_push = nullptr;
  decltype(&::cuCtxPopCurrent) ctx_pop = nullptr;
  decltype(&::cuCtxSynchronize) ctx_synchronize = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemExportToShareableHandle) mem_export = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemsetD8) memset_d8 = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  // Memory from other allocators, shared as legacy IPC handles.
  decltype(&::cuMemGetAddressRange) address_range = nullptr;
  decltype(&::cuIpcGetMemHandle) ipc_get_mem_handle = nullptr;
  decltype(&::cuPointerGetAttribute) pointer_attribute = nullptr;
  // Interprocess events (DESIGN.md decision 7).
  decltype(&::cuEventCreate) event_create = nullptr;
  decltype(&::cuEventDestroy) event_destroy = nullptr;
  decltype(&::cuEventRecord) event_record = nullptr;
  decltype(&::cuEventQuery) event_query = nullptr;
  decltype(&::cuIpcOpenEventHandle) ipc_open_event_handle = nullptr;
  decltype(&::cuStreamIsCapturing) stream_is_capturing = nullptr;
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;
  decltype(&::cuStreamWaitEvent) stream_wait_event = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  // Sparse entries in device memory, read to the host (SparseReducer).
  decltype(&::cuMemcpyAsync) memcpy_async = nullptr;

  std::string describe(CUresult result) const {
    const char* text = nullptr;
    if (error_string) error_string(result, &text);
    return text ? std::string(text) : "CUDA driver error " + std::to_string(static_cast<int>(result));
  }
  Status check(CUresult result, const char* what) const {
    if (result == CUDA_SUCCESS) return Status();
    return Status::internal(std::string(what) + ": " + describe(result));
  }
};

// Loads libcuda.so.1 and initialises the driver; the error says why device memory is
// unavailable. The library stays loaded for the life of the process.
Status load_driver(Driver* d);

// Makes a device's primary context (PyTorch's too) current for a scope and puts the caller's
// back afterwards, so nothing the library does changes the trainer's current context.
class ScopedPrimaryContext {
 public:
  ScopedPrimaryContext(const Driver* d, CUdevice device);
  ~ScopedPrimaryContext();
  ScopedPrimaryContext(const ScopedPrimaryContext&) = delete;
  ScopedPrimaryContext& operator=(const ScopedPrimaryContext&) = delete;
  const Status& status() const { return status_; }

 private:
  const Driver* d_;
  CUdevice device_;
  bool retained_ = false;
  bool pushed_ = false;
  Status status_;
};

}  // namespace gradsync
