// Device memory the client library allocates for gradients: a CUDA VMM allocation (cuMemCreate
// with a POSIX-fd handle), mapped in the trainer and exported as a descriptor that the daemon
// imports. The CUDA driver is loaded only when device memory is first asked for, so a trainer
// that uses host memory alone needs no CUDA installed.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

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
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Zero-filled memory of at least `bytes` on `device`. The error names the cause: no CUDA
  // support in this build, no driver, no such device, or the driver's own error.
  virtual Status allocate(int device, size_t bytes, std::unique_ptr<DeviceAllocation>* out) = 0;

  // Waits until all work queued on `device` in this process is done (cuCtxSynchronize on its
  // primary context, which PyTorch uses too): what the client does before it tells the daemon
  // device tensors are ready, until the interprocess events replace this host wait.
  virtual Status synchronize(int device) = 0;
};

std::unique_ptr<DeviceMemory> make_device_memory();

}  // namespace gradsync
