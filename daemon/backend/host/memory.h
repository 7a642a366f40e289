// Host memory from a client: a memfd sealed against resizing (F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL), mapped read-write. The seals are checked before mapping, so the client can
// never shrink the memory under the daemon's mapping; the descriptor is closed at once, and the
// mapping alone keeps the memory alive until the region goes.
#pragma once

#include <memory>

#include "daemon/model/memory.h"
#include "shared/memfd.h"
#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync::host {

class HostMemoryRegion final : public MemoryRegion {
 public:
  // Checks and maps `fd`; the error names what is wrong with it.
  static Status import(UniqueFd fd, uint64_t bytes, std::shared_ptr<MemoryRegion>* out);

  explicit HostMemoryRegion(Mapping mapping) : mapping_(std::move(mapping)) {}

  MemoryKind kind() const override { return MemoryKind::kHostMemfd; }
  size_t size() const override { return mapping_.size(); }
  std::byte* base() const override { return mapping_.data(); }

 private:
  Mapping mapping_;
};

}  // namespace gradsync::host
