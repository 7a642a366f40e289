// The backend factory: the one place that names the concrete backends (host/ now, cuda/ with
// the CUDA backend). The daemon builds one from its configuration and passes it down; the
// control plane imports client memory through it and jobs get their executors from it, so
// neither ever sees a concrete type. Tests pass fakes of the same interface.
#pragma once

#include <cstdint>
#include <memory>

#include "daemon/backend/executor.h"
#include "daemon/backend/memory.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_pool.h"
#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

class BackendFactory {
 public:
  virtual ~BackendFactory() = default;

  // Checks and maps a buffer a client passed as `fd`, announced as `bytes` of `kind`. The
  // error names what is wrong (unknown kind, not a memfd, missing seals, wrong size).
  virtual Status import_memory(MemoryKind kind, UniqueFd fd, uint64_t bytes, std::shared_ptr<MemoryRegion>* out) = 0;

  // An executor for buckets of sets whose memory is of `kind`, for one job. `pool` is the
  // daemon's reduction pool (host work) and outlives the executor; `log` names the job.
  virtual Status make_executor(MemoryKind kind, ThreadPool* pool, const Logger& log,
                               std::unique_ptr<BucketExecutor>* out) = 0;
};

std::unique_ptr<BackendFactory> make_backend_factory();

}  // namespace gradsync
