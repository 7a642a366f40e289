// The daemon's cache of legacy IPC memory (the CUDA_LEGACY_IPC kind): a cudaIpcMemHandle names
// a whole allocation (PyTorch's caching allocator hands out pieces of large segments), the
// driver allows one open per allocation and context, and opening can take long (GPU-NOTES.md).
// So each (device, handle) is opened once, shared by every registration that uses it, and
// closed when the last one lets go: before the client is told it may free the memory, since
// closing after the exporter freed it is undefined.
#pragma once

#include <map>
#include <memory>
#include <utility>

#include "daemon/backend/cuda/device_api.h"
#include "shared/mutex.h"

namespace gradsync::cuda {

// One opened allocation; closed when the last holder lets go.
class OpenedIpcMemory {
 public:
  OpenedIpcMemory(DeviceApi* api, int device, void* base) : api_(api), device_(device), base_(base) {}
  ~OpenedIpcMemory();
  OpenedIpcMemory(const OpenedIpcMemory&) = delete;
  OpenedIpcMemory& operator=(const OpenedIpcMemory&) = delete;

  void* base() const { return base_; }
  int device() const { return device_; }

 private:
  DeviceApi* api_;
  int device_;
  void* base_;
};

class IpcMemoryCache {
 public:
  explicit IpcMemoryCache(DeviceApi* api) : api_(api) {}

  // The allocation named by `handle` on `device`, opened now or shared with earlier holders.
  // The error names the device and the driver's reason.
  Status acquire(int device, const IpcHandle& handle, std::shared_ptr<OpenedIpcMemory>* out);

  // Allocations currently open (for status and tests).
  size_t open_count();

 private:
  DeviceApi* api_;
  Mutex mutex_;
  // Weak: the holders own the openings; an expired entry is reopened on the next acquire.
  std::map<std::pair<int, IpcHandle>, std::weak_ptr<OpenedIpcMemory>> open_ GS_GUARDED_BY(mutex_);
};

}  // namespace gradsync::cuda
