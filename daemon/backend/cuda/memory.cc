#include "daemon/backend/cuda/memory.h"

#include <cstring>

namespace gradsync::cuda {
namespace {

class VmmRegion final : public MemoryRegion {
 public:
  VmmRegion(DeviceApi* api, int device, void* address, size_t bytes, uint64_t handle)
      : api_(api), device_(device), address_(address), bytes_(bytes), handle_(handle) {}
  ~VmmRegion() override { (void)api_->release_vmm(device_, address_, bytes_, handle_); }
  VmmRegion(const VmmRegion&) = delete;
  VmmRegion& operator=(const VmmRegion&) = delete;

  MemoryKind kind() const override { return MemoryKind::kCudaVmm; }
  size_t size() const override { return bytes_; }
  std::byte* base() const override { return static_cast<std::byte*>(address_); }
  int device() const override { return device_; }

 private:
  DeviceApi* api_;
  int device_;
  void* address_;
  size_t bytes_;
  uint64_t handle_;
};

class IpcRegion final : public MemoryRegion {
 public:
  IpcRegion(std::shared_ptr<OpenedIpcMemory> opened, uint64_t offset, size_t bytes)
      : opened_(std::move(opened)), offset_(offset), bytes_(bytes) {}

  MemoryKind kind() const override { return MemoryKind::kCudaLegacyIpc; }
  size_t size() const override { return bytes_; }
  std::byte* base() const override { return static_cast<std::byte*>(opened_->base()) + offset_; }
  int device() const override { return opened_->device(); }

 private:
  std::shared_ptr<OpenedIpcMemory> opened_;  // the allocation stays open while any piece is used
  uint64_t offset_;
  size_t bytes_;
};

}  // namespace

Status import_device_memory(DeviceApi* api, IpcMemoryCache* ipc, MemoryImport what, std::shared_ptr<MemoryRegion>* out) {
  const std::string kind(memory_kind_name(what.kind));
  int device = -1;
  if (Status status = api->device_of_uuid(what.device_uuid, &device); !status.ok()) {
    return Status(status.code(), kind + " segment: " + status.message());
  }
  if (what.kind == MemoryKind::kCudaVmm) {
    const std::string where = kind + " segment on device " + std::to_string(device);
    uint64_t handle = 0;
    int located = -1;
    if (Status status = api->import_vmm(device, what.fd.get(), &handle, &located); !status.ok()) {
      return Status(status.code(), where + ": " + status.message());
    }
    // The client names the GPU by UUID; the allocation says where it lives. Mapping memory of
    // another GPU would reach it through peer access, and the executor would launch on the
    // wrong GPU's streams: refused.
    if (located != device) {
      (void)api->release_vmm_handle(device, handle);
      return Status::invalid_argument(where + ": the allocation lives on " +
                                      (located < 0 ? std::string("no GPU") : "GPU " + std::to_string(located)) +
                                      ", not on the GPU whose UUID the client named");
    }
    void* address = nullptr;
    if (Status status = api->map_vmm(device, handle, what.bytes, &address); !status.ok()) {
      (void)api->release_vmm_handle(device, handle);
      return Status(status.code(), where + ": " + status.message());
    }
    // The descriptor closes when `what` goes; the import holds the allocation from here on.
    *out = std::make_shared<VmmRegion>(api, device, address, what.bytes, handle);
    return Status();
  }
  IpcHandle handle{};
  std::memcpy(handle.data(), what.ipc_handle.data(), handle.size());
  std::shared_ptr<OpenedIpcMemory> opened;
  if (Status status = ipc->acquire(device, handle, &opened); !status.ok()) {
    return Status(status.code(), kind + " segment: " + status.message());
  }
  size_t allocation = 0;
  if (Status status = api->allocation_size(device, opened->base(), &allocation); !status.ok()) {
    return Status(status.code(), kind + " segment: " + status.message());
  }
  if (what.ipc_offset > allocation || what.bytes > allocation - what.ipc_offset) {
    return Status::invalid_argument(kind + " segment: offset " + std::to_string(what.ipc_offset) + " + " +
                                std::to_string(what.bytes) + " bytes lies outside the allocation of " +
                                std::to_string(allocation) + " bytes");
  }
  *out = std::make_shared<IpcRegion>(std::move(opened), what.ipc_offset, what.bytes);
  return Status();
}

}  // namespace gradsync::cuda
