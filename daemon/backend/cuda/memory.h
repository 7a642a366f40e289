// Device memory from a client, as MemoryRegions (the CUDA kinds of model/memory.h):
//   CUDA VMM: the allocation the client exported as a descriptor, imported and mapped here
//     once; the driver keeps the physical memory until this mapping goes too, so a client that
//     dies cannot pull pages from under the daemon.
//   CUDA legacy IPC: a piece of another allocator's allocation, through the shared opening of
//     that allocation in the IpcMemoryCache; the piece must lie inside the allocation.
// The GPU is named by its UUID, translated to this process's ordinal.
#pragma once

#include <memory>

#include "daemon/backend/cuda/device_api.h"
#include "daemon/backend/cuda/ipc_cache.h"
#include "daemon/backend/factory.h"
#include "daemon/model/memory.h"

namespace gradsync::cuda {

// Imports a segment of a CUDA kind; the error names what is wrong (unknown GPU, a failed
// import, a piece outside its allocation). `what` must have passed the factory's field checks.
Status import_device_memory(DeviceApi* api, IpcMemoryCache* ipc, MemoryImport what, std::shared_ptr<MemoryRegion>* out);

}  // namespace gradsync::cuda
