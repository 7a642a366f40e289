// The CUDA calls the backend's orchestration makes (IPC memory and events, streams), behind an
// interface: the real one (cuda_api.cc) calls the CUDA runtime, and host tests pass a fake that
// fails or counts, so the handle cache and the event rings are tested without a GPU.
// Handles and pointers are opaque here (void*), so this header needs no CUDA headers.
//
// Two rules keep one job's GPU work from stalling another's in the daemon's shared context:
//   - Every call names its device, and runs with that device current (the real api makes it
//     current for the call): a call with none current would create GPU 0's context.
//   - No call synchronises the whole device. Memory is allocated and freed in stream order
//     (cudaMallocAsync / cudaFreeAsync on the executor's stream), and tables are uploaded on
//     that stream: a cudaFree would wait for every stream of the context, including one that
//     waits forever on a client's event.
// A sticky error (an illegal address, a kernel that faulted) breaks the daemon's context on
// that GPU for good; health() reports it from then on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shared/status.h"

namespace gradsync::cuda {

// cudaIpcMemHandle_t and cudaIpcEventHandle_t are both 64 opaque bytes.
using IpcHandle = std::array<unsigned char, 64>;

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  // The ordinal, as this process sees it, of the GPU with this 16-byte UUID.
  virtual Status device_of_uuid(const std::string& uuid, int* device) = 0;

  // Imports a VMM allocation a client exported as `fd` (cuMemImportFromShareableHandle, with
  // `device` current) and says which GPU it lives on (cuMemGetAllocationPropertiesFromHandle),
  // so the caller can hold the client to the GPU it named. `handle` is released with
  // release_vmm_handle unless map_vmm took it.
  virtual Status import_vmm(int device, int fd, uint64_t* handle, int* located) = 0;
  virtual Status release_vmm_handle(int device, uint64_t handle) = 0;
  // Maps `bytes` of an imported allocation read-write on `device` (cuMemAddressReserve,
  // cuMemMap, cuMemSetAccess). On success the mapping owns `handle`, and release_vmm unmaps it
  // and releases both; on failure the handle is still the caller's.
  virtual Status map_vmm(int device, uint64_t handle, size_t bytes, void** address) = 0;
  virtual Status release_vmm(int device, void* address, size_t bytes, uint64_t handle) = 0;

  // The size of the allocation that starts at `base` (cuMemGetAddressRange).
  virtual Status allocation_size(int device, void* base, size_t* bytes) = 0;

  // Opens another process's allocation (cudaIpcOpenMemHandle) on `device`; the base address of
  // the allocation in this process.
  virtual Status open_ipc_memory(int device, const IpcHandle& handle, void** base) = 0;
  virtual Status close_ipc_memory(int device, void* base) = 0;

  // Creates an interprocess event on `device` (cudaEventInterprocess | cudaEventDisableTiming)
  // and its handle for a client to open (cudaIpcGetEventHandle). The daemon creates the events
  // it uses with clients and never opens one a client names: an event handle is no more proof
  // of ownership than a memory handle.
  virtual Status create_ipc_event(int device, void** event, IpcHandle* handle) = 0;
  virtual Status destroy_event(int device, void* event) = 0;
  // An event of the daemon's own on `device` (cudaEventDisableTiming), and whether the work
  // before its latest record is done (cudaEventQuery; an error is a sticky CUDA error).
  virtual Status create_event(int device, void** event) = 0;
  // `device` is the event's: it is made current for the query (a watchdog thread has none).
  virtual Status query_event(int device, void* event, bool* done) = 0;

  // Makes `device` the calling thread's current device and leaves it so: for a thread that
  // launches kernels on that device's streams (the job's worker).
  virtual Status make_current(int device) = 0;

  // Device memory of the daemon's own (bucket buffers, launch tables), in `stream`'s order
  // (cudaMallocAsync, cudaFreeAsync): usable by work queued on `stream` after the allocation,
  // and freed once the work queued before the free is done. Neither waits for the device.
  virtual Status allocate(int device, size_t bytes, void* stream, void** memory) = 0;
  virtual Status free(int device, void* memory, void* stream) = 0;
  // Copies host bytes to device memory in `stream`'s order; `from` may be reused once it
  // returns (tables, once per bucket).
  virtual Status upload(int device, void* to, const void* from, size_t bytes, void* stream) = 0;
  // Copies device bytes to host memory after the work queued on `stream` before it, and
  // returns once they are there (it waits for that work: call it after a synchronisation).
  virtual Status download(int device, void* to, const void* from, size_t bytes, void* stream) = 0;
  // Sets `bytes` of device memory to zero in `stream`'s order (cudaMemsetAsync).
  virtual Status zero(int device, void* at, size_t bytes, void* stream) = 0;
  // Gives the device memory of the daemon's that nobody holds back to the driver (the pool
  // keeps freed memory otherwise): when a job's executor goes.
  virtual Status trim(int device) = 0;

  // A non-blocking stream of the daemon's on `device`, and waiting for all work on it.
  virtual Status create_stream(int device, void** stream) = 0;
  virtual Status destroy_stream(int device, void* stream) = 0;
  virtual Status synchronize(int device, void* stream) = 0;

  // Enqueues on `stream` (of `device`): a wait for the event's latest record, or a record of it.
  virtual Status stream_wait_event(int device, void* stream, void* event) = 0;
  virtual Status record_event(int device, void* event, void* stream) = 0;

  // Ok, or the sticky error that broke the daemon's context on `device`: every later call on
  // it fails, and only a new process recovers.
  virtual Status health(int device) = 0;
};

// The CUDA runtime; only in builds with the CUDA backend (the factory makes it).
std::unique_ptr<DeviceApi> make_cuda_device_api();

}  // namespace gradsync::cuda
