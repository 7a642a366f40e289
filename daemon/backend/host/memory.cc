#include "daemon/backend/host/memory.h"

namespace gradsync::host {

Status HostMemoryRegion::import(UniqueFd fd, uint64_t bytes, std::shared_ptr<MemoryRegion>* out) {
  const std::string what = "the host memory descriptor";
  if (bytes == 0) return Status::invalid_argument("a segment must not have zero bytes");
  if (Status status = check_memfd(fd.get(), kSizeSeals, bytes, what); !status.ok()) return status;
  Mapping mapping;
  if (Status status = map_fd(fd.get(), bytes, Access::kReadWrite, what, &mapping); !status.ok()) return status;
  *out = std::make_shared<HostMemoryRegion>(std::move(mapping));
  return Status::ok_status();
}

}  // namespace gradsync::host
