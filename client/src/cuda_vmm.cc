#include "client/src/cuda_vmm.h"

#include <cuda.h>

#include "client/src/cuda_driver.h"
#include "client/src/cuda_events.h"

#include <mutex>
#include <optional>

namespace gradsync {
namespace {

class VmmAllocation final : public DeviceAllocation {
 public:
  VmmAllocation(const Driver* d, int ordinal, CUdevice device, CUmemGenericAllocationHandle handle, CUdeviceptr address,
                size_t size, std::string uuid)
      : d_(d), ordinal_(ordinal), device_(device), handle_(handle), address_(address), size_(size), uuid_(std::move(uuid)) {}
  ~VmmAllocation() override {
    // The device's context around the unmapping, and the caller's current context (PyTorch's)
    // put back afterwards.
    CUcontext context = nullptr;
    const bool retained = d_->primary_ctx_retain(&context, device_) == CUDA_SUCCESS;
    const bool pushed = retained && d_->ctx_push(context) == CUDA_SUCCESS;
    d_->mem_unmap(address_, size_);
    d_->address_free(address_, size_);
    d_->mem_release(handle_);
    if (pushed) {
      CUcontext popped = nullptr;
      d_->ctx_pop(&popped);
    }
    if (retained) d_->primary_ctx_release(device_);  // this destructor's own retain
    d_->primary_ctx_release(device_);                // the allocation's
  }

  std::byte* data() const override { return reinterpret_cast<std::byte*>(address_); }
  size_t size() const override { return size_; }
  int device() const override { return ordinal_; }
  const std::string& device_uuid() const override { return uuid_; }
  Status synchronize() const override {
    CUcontext context = nullptr;
    if (Status s = d_->check(d_->primary_ctx_retain(&context, device_), "cuDevicePrimaryCtxRetain"); !s.ok()) return s;
    Status status = d_->check(d_->ctx_push(context), "cuCtxPushCurrent");
    if (status.ok()) {
      status = d_->check(d_->ctx_synchronize(), "cuCtxSynchronize");
      CUcontext popped = nullptr;
      d_->ctx_pop(&popped);
    }
    d_->primary_ctx_release(device_);
    return status;
  }
  Status export_fd(UniqueFd* fd) const override {
    int raw = -1;
    if (Status s = d_->check(d_->mem_export(&raw, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                             "cuMemExportToShareableHandle");
        !s.ok()) {
      return s;
    }
    *fd = UniqueFd(raw);
    return Status();
  }

 private:
  const Driver* d_;
  int ordinal_;
  CUdevice device_;
  CUmemGenericAllocationHandle handle_;
  CUdeviceptr address_;
  size_t size_;
  std::string uuid_;
};

// Memory another allocator owns: described, never freed here.
class ForeignAllocation final : public DeviceAllocation {
 public:
  ForeignAllocation(std::byte* data, size_t size, int ordinal, std::string uuid)
      : data_(data), size_(size), ordinal_(ordinal), uuid_(std::move(uuid)) {}
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }
  int device() const override { return ordinal_; }
  const std::string& device_uuid() const override { return uuid_; }
  Status synchronize() const override { return Status(); }  // never freed here
  Status export_fd(UniqueFd*) const override {
    return Status::not_supported("memory from another allocator travels as a legacy IPC handle, not a descriptor");
  }

 private:
  std::byte* data_;
  size_t size_;
  int ordinal_;
  std::string uuid_;
};

class CudaVmmMemory final : public DeviceMemory {
 public:
  Status allocate(int ordinal, size_t bytes, std::unique_ptr<DeviceAllocation>* out) override {
    CUdevice device = 0;
    if (Status s = driver_and_device(ordinal, &device); !s.ok()) return s;
    const Driver& d = driver_;
    CUcontext context = nullptr;
    if (Status s = d.check(d.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain"); !s.ok()) return s;
    // The device's primary context is pushed for the allocation and popped at the end, so the
    // caller's current context (PyTorch's) is what it was.
    if (Status s = d.check(d.ctx_push(context), "cuCtxPushCurrent"); !s.ok()) {
      d.primary_ctx_release(device);
      return s;
    }
    struct PopOnExit {
      const Driver& d;
      ~PopOnExit() {
        CUcontext popped = nullptr;
        d.ctx_pop(&popped);
      }
    } pop_on_exit{d};
    // From here on, every failure releases what was taken so far.
    auto fail = [&](Status status, CUmemGenericAllocationHandle* handle, CUdeviceptr address, size_t size) {
      if (address) {
        d.mem_unmap(address, size);
        d.address_free(address, size);
      }
      if (handle) d.mem_release(*handle);
      d.primary_ctx_release(device);
      return Status(status.code(), "device memory on device " + std::to_string(ordinal) + ": " + status.message());
    };
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    if (Status s = d.check(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                           "cuMemGetAllocationGranularity");
        !s.ok()) {
      return fail(s, nullptr, 0, 0);
    }
    const size_t size = (std::max<size_t>(bytes, 1) + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle = 0;
    if (Status s = d.check(d.mem_create(&handle, size, &prop, 0), "cuMemCreate"); !s.ok()) return fail(s, nullptr, 0, 0);
    CUdeviceptr address = 0;
    if (Status s = d.check(d.address_reserve(&address, size, granularity, 0, 0), "cuMemAddressReserve"); !s.ok()) {
      return fail(s, &handle, 0, 0);
    }
    if (Status s = d.check(d.mem_map(address, size, 0, handle, 0), "cuMemMap"); !s.ok()) {
      d.address_free(address, size);
      return fail(s, &handle, 0, 0);
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (Status s = d.check(d.mem_set_access(address, size, &access, 1), "cuMemSetAccess"); !s.ok()) {
      return fail(s, &handle, address, size);
    }
    // cuMemsetD8 is asynchronous to the host: wait, so that no stream of the trainer or the
    // daemon can see the memory before it is zero.
    if (Status s = d.check(d.memset_d8(address, 0, size), "cuMemsetD8"); !s.ok()) return fail(s, &handle, address, size);
    if (Status s = d.check(d.ctx_synchronize(), "cuCtxSynchronize"); !s.ok()) return fail(s, &handle, address, size);
    CUuuid uuid{};
    if (Status s = d.check(d.device_get_uuid(&uuid, device), "cuDeviceGetUuid"); !s.ok()) {
      return fail(s, &handle, address, size);
    }
    *out = std::make_unique<VmmAllocation>(&driver_, ordinal, device, handle, address, size,
                                           std::string(uuid.bytes, sizeof(uuid.bytes)));
    return Status();
  }

  Status describe_foreign(int ordinal, void* data, size_t bytes, std::unique_ptr<DeviceAllocation>* out,
                          std::string* ipc_handle, uint64_t* ipc_offset) override {
    CUdevice device = 0;
    if (Status s = driver_and_device(ordinal, &device); !s.ok()) return s;
    const Driver& d = driver_;
    ScopedPrimaryContext context(&d, device);
    if (!context.status().ok()) return context.status();
    const auto address = reinterpret_cast<CUdeviceptr>(data);
    if (Status s = check_on_device(address, ordinal); !s.ok()) return s;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (Status s = d.check(d.address_range(&base, &size, address), "cuMemGetAddressRange"); !s.ok()) return s;
    if (bytes > size - (address - base)) {
      return Status::invalid_argument(std::to_string(bytes) + " bytes at offset " + std::to_string(address - base) +
                                      " run past the end of their allocation of " + std::to_string(size) + " bytes");
    }
    CUipcMemHandle handle{};
    if (Status s = d.check(d.ipc_get_mem_handle(&handle, base), "cuIpcGetMemHandle (memory from cuMemCreate cannot be "
                                                               "shared this way: use allocate_device)");
        !s.ok()) {
      return s;
    }
    CUuuid uuid{};
    if (Status s = d.check(d.device_get_uuid(&uuid, device), "cuDeviceGetUuid"); !s.ok()) return s;
    *ipc_handle = std::string(handle.reserved, sizeof(handle.reserved));
    *ipc_offset = address - base;
    *out = std::make_unique<ForeignAllocation>(static_cast<std::byte*>(data), bytes, ordinal,
                                               std::string(uuid.bytes, sizeof(uuid.bytes)));
    return Status();
  }

  Status open_events(int ordinal, const std::vector<std::string>& ready, const std::vector<std::string>& done,
                     std::unique_ptr<DeviceEvents>* out) override {
    std::call_once(loaded_, [&] { load_status_ = load_driver(&driver_); });
    if (!load_status_.ok()) return Status(load_status_.code(), "device events: " + load_status_.message());
    return open_cuda_device_events(&driver_, ordinal, ready, done, out);
  }

  Status copy_to_host(int ordinal, void* to, const void* from, size_t bytes, void* stream) override {
    if (bytes == 0) return Status();
    CUdevice device = 0;
    if (Status s = driver_and_device(ordinal, &device); !s.ok()) return s;
    const Driver& d = driver_;
    ScopedPrimaryContext context(&d, device);
    if (!context.status().ok()) return context.status();
    // Host memory handed over as "device" memory would be copied without complaint (unified
    // addressing), and memory of another GPU read across: both are the caller's mistake.
    const auto address = reinterpret_cast<CUdeviceptr>(from);
    if (Status s = check_on_device(address, ordinal); !s.ok()) return s;
    const auto cu_stream = static_cast<CUstream>(stream);
    if (Status s = d.check(d.memcpy_async(reinterpret_cast<CUdeviceptr>(to), address, bytes, cu_stream), "cuMemcpyAsync");
        !s.ok()) {
      return s;
    }
    return d.check(d.stream_synchronize(cu_stream), "cuStreamSynchronize");
  }

 private:
  // That `address` is device memory of device `ordinal`, with its primary context current.
  Status check_on_device(CUdeviceptr address, int ordinal) const {
    int on = -1;
    if (CUresult r = driver_.pointer_attribute(&on, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address); r != CUDA_SUCCESS) {
      return Status::invalid_argument("memory at " + std::to_string(address) + " is not CUDA device memory (" +
                                      driver_.describe(r) + ")");
    }
    if (on != ordinal) {
      return Status::invalid_argument("memory at " + std::to_string(address) + " is on device " + std::to_string(on) +
                                      ", not " + std::to_string(ordinal));
    }
    return Status();
  }

  // Loads the driver (once) and finds device `ordinal`; the error names which failed.
  Status driver_and_device(int ordinal, CUdevice* device) {
    std::call_once(loaded_, [&] { load_status_ = load_driver(&driver_); });
    if (!load_status_.ok()) return Status(load_status_.code(), "device memory: " + load_status_.message());
    if (CUresult r = driver_.device_get(device, ordinal); r != CUDA_SUCCESS) {
      return Status::invalid_argument("device memory: no CUDA device " + std::to_string(ordinal) + " (" +
                                      driver_.describe(r) + ")");
    }
    return Status();
  }

  std::once_flag loaded_;
  Status load_status_;
  Driver driver_;
};

}  // namespace

std::unique_ptr<DeviceMemory> make_cuda_vmm_memory() { return std::make_unique<CudaVmmMemory>(); }

}  // namespace gradsync
