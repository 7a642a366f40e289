// Device memory the client library allocates for gradients: a CUDA VMM allocation (cuMemCreate
// with a POSIX-fd handle), mapped in the trainer and exported as a descriptor that the daemon
// imports. The CUDA driver is loaded only when device memory is first asked for, so a trainer
// that uses host memory alone needs no CUDA installed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

// One allocation, unmapped and released when it goes.
class DeviceAllocation {
 public:
  virtual ~DeviceAllocation() = default;
  virtual std::byte* data() const = 0;  // a device address in this process
  virtual size_t size() const = 0;      // rounded up to the allocation granularity
  virtual int device() const = 0;       // the ordinal as this process sees it
  virtual const std::string& device_uuid() const = 0;  // 16 bytes: the daemon's name for the GPU
  // A new descriptor of the allocation for the daemon (cuMemExportToShareableHandle).
  virtual Status export_fd(UniqueFd* fd) const = 0;
  // Waits until the work queued on the allocation's device in this process is through
  // (cuCtxSynchronize on its primary context, as cudaFree does before it frees): for memory
  // freed on the caller's behalf, which a kernel of the caller's may still be using. Unbounded,
  // as that is.
  virtual Status synchronize() const = 0;
};

// A client's interprocess events for one device set (DESIGN.md decision 7): two rings of
// kDeviceEventsPerDirection events the daemon made (and owns) for this client, opened from the
// handles in the RegisterReply. Operation seq uses slot seq % kDeviceEventsPerDirection.
// Streams are CUstream / cudaStream_t values; nullptr is the legacy default stream.
class DeviceEvents {
 public:
  virtual ~DeviceEvents() = default;

  // Records operation seq's ready event after all work queued on `stream` so far, and after
  // every earlier record. Records go through one internal stream that waits on the caller's,
  // so the event's latest record covers every tensor announced for the operation, whichever
  // streams wrote them. Call it before announcing the tensors.
  virtual Status record_ready(uint64_t seq, void* stream) = 0;

  // Makes `stream` wait for operation seq's done event (recorded by the daemon before it
  // answered the operation) without blocking the host. Cannot be cancelled once queued: if the
  // daemon's GPU work never ends, neither does the stream's wait.
  virtual Status wait_done(uint64_t seq, void* stream) = 0;

  // Polls operation seq's done event from the host until the GPU is through it (*done) or the
  // deadline passes.
  virtual Status host_wait_done(uint64_t seq, std::chrono::steady_clock::time_point deadline, bool* done) = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Zero-filled memory of at least `bytes` on `device`. The error names the cause: no CUDA
  // support in this build, no driver, no such device, or the driver's own error.
  virtual Status allocate(int device, size_t bytes, std::unique_ptr<DeviceAllocation>* out) = 0;

  // Opens the event rings the daemon made for one device set on `device` (RegisterReply).
  virtual Status open_events(int device, const std::vector<std::string>& ready, const std::vector<std::string>& done,
                             std::unique_ptr<DeviceEvents>* out) = 0;

  // Device memory some other allocator made (cudaMalloc, PyTorch's caching allocator), for the
  // legacy route: `bytes` at `data` on `device`, described as the 64-byte cudaIpcMemHandle_t of
  // its allocation's base plus the offset into it. *out describes the memory (its export_fd
  // fails: the daemon opens the handle instead) and owns nothing.
  virtual Status describe_foreign(int device, void* data, size_t bytes, std::unique_ptr<DeviceAllocation>* out,
                                  std::string* ipc_handle, uint64_t* ipc_offset) = 0;

  // Copies `bytes` of device memory on `device` at `from` to host memory at `to`, after the work
  // queued on `stream` so far (a CUstream; nullptr is the legacy default stream), and waits for
  // the copy. `from` must be memory of that device (refused by name otherwise), whichever
  // allocator made it.
  virtual Status copy_to_host(int device, void* to, const void* from, size_t bytes, void* stream) = 0;
};

std::unique_ptr<DeviceMemory> make_device_memory();

}  // namespace gradsync
