#include "daemon/backend/factory.h"

#include "daemon/backend/host/executor.h"
#include "daemon/backend/host/memory.h"

namespace gradsync {
namespace {

class Backends final : public BackendFactory {
 public:
  Status import_memory(MemoryKind kind, UniqueFd fd, uint64_t bytes, std::shared_ptr<MemoryRegion>* out) override {
    switch (kind) {
      case MemoryKind::kHostMemfd: return host::HostMemoryRegion::import(std::move(fd), bytes, out);
    }
    return Status::invalid_argument("unknown memory kind " + std::to_string(static_cast<uint32_t>(kind)) +
                                    " (this daemon takes host memfds)");
  }

  Status make_executor(MemoryKind kind, ThreadPool* pool, const Logger& log,
                       std::unique_ptr<BucketExecutor>* out) override {
    switch (kind) {
      case MemoryKind::kHostMemfd: *out = std::make_unique<host::HostExecutor>(pool, log); return Status();
    }
    return Status::invalid_argument("no executor for memory kind " + std::to_string(static_cast<uint32_t>(kind)));
  }
};

}  // namespace

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHostMemfd: return "host memfd";
  }
  return "unknown";
}

std::unique_ptr<BackendFactory> make_backend_factory() { return std::make_unique<Backends>(); }

}  // namespace gradsync
