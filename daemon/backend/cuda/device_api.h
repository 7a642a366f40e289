// The CUDA calls the backend's orchestration makes (IPC memory and events, streams), behind an
// interface: the real one (cuda_api.cc) calls the CUDA runtime, and host tests pass a fake that
// fails or counts, so the handle cache and the event rings are tested without a GPU.
// Handles and pointers are opaque here (void*), so this header needs no CUDA headers.
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

  // Imports a VMM allocation a client exported as `fd` (cuMemImportFromShareableHandle) and
  // maps `bytes` of it read-write on `device` (cuMemAddressReserve, cuMemMap, cuMemSetAccess).
  // `handle` is what release_vmm needs back.
  virtual Status import_vmm(int device, int fd, size_t bytes, void** address, uint64_t* handle) = 0;
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

  // Device memory of the daemon's own (bucket buffers, launch tables).
  virtual Status allocate(int device, size_t bytes, void** memory) = 0;
  virtual Status free(int device, void* memory) = 0;
  // Copies host bytes to device memory and returns when they are there (tables, once).
  virtual Status upload(int device, void* to, const void* from, size_t bytes) = 0;

  // A non-blocking stream of the daemon's on `device`, and waiting for all work on it.
  virtual Status create_stream(int device, void** stream) = 0;
  virtual Status destroy_stream(int device, void* stream) = 0;
  virtual Status synchronize(void* stream) = 0;

  // Enqueues on `stream`: a wait for the event's latest record, or a record of it.
  virtual Status stream_wait_event(void* stream, void* event) = 0;
  virtual Status record_event(void* event, void* stream) = 0;
};

// The CUDA runtime; only in builds with the CUDA backend (the factory makes it).
std::unique_ptr<DeviceApi> make_cuda_device_api();

}  // namespace gradsync::cuda
