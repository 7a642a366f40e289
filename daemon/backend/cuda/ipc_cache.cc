#include "daemon/backend/cuda/ipc_cache.h"

namespace gradsync::cuda {

OpenedIpcMemory::~OpenedIpcMemory() {
  // Nothing to tell anybody: the registrations that used it are gone already.
  (void)api_->close_ipc_memory(device_, base_);
}

Status IpcMemoryCache::acquire(int device, const IpcHandle& handle, std::shared_ptr<OpenedIpcMemory>* out) {
  MutexLock lock(mutex_);
  const auto key = std::make_pair(device, handle);
  if (auto it = open_.find(key); it != open_.end()) {
    if (auto opened = it->second.lock()) {
      *out = std::move(opened);
      return Status();
    }
    open_.erase(it);
  }
  void* base = nullptr;
  if (Status status = api_->open_ipc_memory(device, handle, &base); !status.ok()) {
    return Status(status.code(), "opening a CUDA IPC memory handle on device " + std::to_string(device) + ": " +
                                     status.message());
  }
  auto opened = std::make_shared<OpenedIpcMemory>(api_, device, base);
  open_[key] = opened;
  *out = std::move(opened);
  return Status();
}

size_t IpcMemoryCache::open_count() {
  MutexLock lock(mutex_);
  size_t count = 0;
  for (const auto& [key, weak] : open_) count += weak.expired() ? 0 : 1;
  return count;
}

}  // namespace gradsync::cuda
