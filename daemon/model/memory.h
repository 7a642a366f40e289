// MemoryRegion: one buffer a client handed to the daemon, mapped into the daemon once at
// registration and released (unmapped, handles closed) when the last user lets go. Every kind
// (host memfd now; CUDA VMM and legacy IPC with the CUDA backend) is one implementation in its
// backend's folder; the control plane and the job see only this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradsync {

enum class MemoryKind : uint32_t {  // values match control.proto's MemoryKind
  kHostMemfd = 1,
  kCudaVmm = 2,
  kCudaLegacyIpc = 3,
};

// Whether a Segment of this kind carries a descriptor (the legacy IPC kind travels as a handle).
inline bool memory_kind_takes_fd(MemoryKind kind) { return kind != MemoryKind::kCudaLegacyIpc; }

std::string_view memory_kind_name(MemoryKind kind);

// One client's interprocess events for one device set (DESIGN.md decision 7), created by the
// daemon at registration and destroyed when the set goes. The control plane sees only the
// handles it sends the client (RegisterReply).
class ClientEvents {
 public:
  virtual ~ClientEvents() = default;
  virtual std::vector<std::string> ready_handles() const = 0;  // 64-byte cudaIpcEventHandle_t each
  virtual std::vector<std::string> done_handles() const = 0;
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;

  virtual MemoryKind kind() const = 0;
  virtual size_t size() const = 0;

  // The first byte in the daemon's address space: host memory for host kinds, a device address
  // for device kinds. Offsets from clients are checked against size() before use.
  virtual std::byte* base() const = 0;

  // The CUDA device ordinal (as the daemon sees it) for device kinds; -1 for host memory.
  virtual int device() const { return -1; }
};

}  // namespace gradsync
