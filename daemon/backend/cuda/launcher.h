// How the CUDA executor launches its kernels: kernels.h on the GPU; in host tests, a fake that
// runs the same functors over host memory standing in for device memory, so the executor's
// tables and launch sequence are checked bit for bit without a GPU.
#pragma once

#include <memory>

#include "daemon/backend/cuda/functors.h"
#include "daemon/backend/cuda/health_functor.h"
#include "daemon/reduce/kernel.h"
#include "shared/status.h"

namespace gradsync::cuda {

class KernelLauncher {
 public:
  virtual ~KernelLauncher() = default;
  virtual Status gather(const reduce::KernelArgs& args, const BucketTable& table, void* stream) = 0;
  virtual Status scatter(const reduce::KernelArgs& args, const BucketTable& table, void* stream) = 0;
  // Fused health of results of `dtype` (health_functor.h).
  virtual Status health(DType dtype, const HealthTable& table, void* stream) = 0;
  // Loads every kernel into the current device's context (kernels.h), before any job runs
  // there; *loaded counts them.
  virtual Status preload(int* loaded) = 0;
};

// kernels.h; only in builds with the CUDA backend.
std::unique_ptr<KernelLauncher> make_cuda_kernel_launcher();

}  // namespace gradsync::cuda
