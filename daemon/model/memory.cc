#include "daemon/model/memory.h"

namespace gradsync {

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHostMemfd: return "host memfd";
    case MemoryKind::kCudaVmm: return "CUDA VMM";
    case MemoryKind::kCudaLegacyIpc: return "CUDA legacy IPC";
  }
  return "unknown";
}

}  // namespace gradsync
