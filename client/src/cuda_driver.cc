#include "client/src/cuda_driver.h"

#include <dlfcn.h>

#include <type_traits>

namespace gradsync {

Status load_driver(Driver* d) {
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) return Status::not_supported(std::string("no usable CUDA driver: ") + ::dlerror());
  const auto resolve = [&](auto* slot, const char* symbol) {
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(::dlsym(library, symbol));
    return *slot != nullptr;
  };
  const bool all = resolve(&d->init, "cuInit") && resolve(&d->device_get, "cuDeviceGet") &&
                   resolve(&d->device_get_uuid, "cuDeviceGetUuid_v2") &&
                   resolve(&d->primary_ctx_retain, "cuDevicePrimaryCtxRetain") &&
                   resolve(&d->primary_ctx_release, "cuDevicePrimaryCtxRelease_v2") &&
                   resolve(&d->ctx_push, "cuCtxPushCurrent_v2") && resolve(&d->ctx_pop, "cuCtxPopCurrent_v2") &&
                   resolve(&d->ctx_synchronize, "cuCtxSynchronize") &&
                   resolve(&d->granularity, "cuMemGetAllocationGranularity") &&
                   resolve(&d->mem_create, "cuMemCreate") &&
                   resolve(&d->mem_export, "cuMemExportToShareableHandle") &&
                   resolve(&d->address_reserve, "cuMemAddressReserve") &&
                   resolve(&d->address_free, "cuMemAddressFree") && resolve(&d->mem_map, "cuMemMap") &&
                   resolve(&d->mem_unmap, "cuMemUnmap") && resolve(&d->mem_set_access, "cuMemSetAccess") &&
                   resolve(&d->mem_release, "cuMemRelease") && resolve(&d->memset_d8, "cuMemsetD8_v2") &&
                   resolve(&d->error_string, "cuGetErrorString") && resolve(&d->event_create, "cuEventCreate") &&
                   resolve(&d->event_destroy, "cuEventDestroy_v2") && resolve(&d->event_record, "cuEventRecord") &&
                   resolve(&d->event_query, "cuEventQuery") &&
                   resolve(&d->ipc_open_event_handle, "cuIpcOpenEventHandle") &&
                   resolve(&d->stream_is_capturing, "cuStreamIsCapturing") &&
                   resolve(&d->stream_create, "cuStreamCreate") &&
                   resolve(&d->stream_destroy, "cuStreamDestroy_v2") &&
                   resolve(&d->stream_wait_event, "cuStreamWaitEvent") &&
                   resolve(&d->stream_synchronize, "cuStreamSynchronize") &&
                   resolve(&d->address_range, "cuMemGetAddressRange_v2") &&
                   resolve(&d->ipc_get_mem_handle, "cuIpcGetMemHandle") &&
                   resolve(&d->pointer_attribute, "cuPointerGetAttribute");
  if (!all) return Status::not_supported("the CUDA driver (libcuda.so.1) lacks the virtual memory API (CUDA 10.2+)");
  if (CUresult r = d->init(0); r != CUDA_SUCCESS) {
    return Status::not_supported("no usable CUDA driver: cuInit: " + d->describe(r));
  }
  return Status();
}


ScopedPrimaryContext::ScopedPrimaryContext(const Driver* d, CUdevice device) : d_(d), device_(device) {
  CUcontext context = nullptr;
  status_ = d_->check(d_->primary_ctx_retain(&context, device_), "cuDevicePrimaryCtxRetain");
  retained_ = status_.ok();
  if (retained_) {
    status_ = d_->check(d_->ctx_push(context), "cuCtxPushCurrent");
    pushed_ = status_.ok();
  }
}

ScopedPrimaryContext::~ScopedPrimaryContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    d_->ctx_pop(&popped);
  }
  if (retained_) d_->primary_ctx_release(device_);
}

}  // namespace gradsync
