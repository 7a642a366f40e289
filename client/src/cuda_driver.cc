#include "client/src/cuda_driver.h"

#include <dlfcn.h>

#include <string>

#include "shared/symbol_table.h"

namespace gradsync {

Status load_driver(Driver* d) {
  void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) return Status::not_supported(std::string("no usable CUDA driver: ") + ::dlerror());
  SymbolTable table(library);
  table("cuInit", &d->init)
       ("cuDeviceGet", &d->device_get)
       ("cuDeviceGetUuid_v2", &d->device_get_uuid)
       ("cuDevicePrimaryCtxRetain", &d->primary_ctx_retain)
       ("cuDevicePrimaryCtxRelease_v2", &d->primary_ctx_release)
       ("cuCtxPushCurrent_v2", &d->ctx_push)
       ("cuCtxPopCurrent_v2", &d->ctx_pop)
       ("cuCtxSynchronize", &d->ctx_synchronize)
       ("cuMemGetAllocationGranularity", &d->granularity)
       ("cuMemCreate", &d->mem_create)
       ("cuMemExportToShareableHandle", &d->mem_export)
       ("cuMemAddressReserve", &d->address_reserve)
       ("cuMemAddressFree", &d->address_free)
       ("cuMemMap", &d->mem_map)
       ("cuMemUnmap", &d->mem_unmap)
       ("cuMemSetAccess", &d->mem_set_access)
       ("cuMemRelease", &d->mem_release)
       ("cuMemsetD8_v2", &d->memset_d8)
       ("cuGetErrorString", &d->error_string)
       ("cuEventCreate", &d->event_create)
       ("cuEventDestroy_v2", &d->event_destroy)
       ("cuEventRecord", &d->event_record)
       ("cuEventQuery", &d->event_query)
       ("cuIpcOpenEventHandle", &d->ipc_open_event_handle)
       ("cuStreamIsCapturing", &d->stream_is_capturing)
       ("cuStreamCreate", &d->stream_create)
       ("cuStreamDestroy_v2", &d->stream_destroy)
       ("cuStreamWaitEvent", &d->stream_wait_event)
       ("cuStreamSynchronize", &d->stream_synchronize)
       ("cuMemcpyAsync", &d->memcpy_async)
       ("cuMemGetAddressRange_v2", &d->address_range)
       ("cuIpcGetMemHandle", &d->ipc_get_mem_handle)
       ("cuPointerGetAttribute", &d->pointer_attribute);
  if (!table.complete()) {
    return Status::not_supported("the CUDA driver (libcuda.so.1) lacks " + table.missing() +
                                 ": the virtual memory API needs CUDA 10.2 or newer");
  }
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
