// The real KernelLauncher: kernels.h. Only in builds with the CUDA backend.
#include "daemon/backend/cuda/launcher.h"

#include "daemon/backend/cuda/kernels.h"

namespace gradsync::cuda {
namespace {

class CudaKernelLauncher final : public KernelLauncher {
 public:
  Status gather(const reduce::KernelArgs& args, const BucketTable& table, void* stream) override {
    return launch_gather(args, table, stream);
  }
  Status scatter(const reduce::KernelArgs& args, const BucketTable& table, void* stream) override {
    return launch_scatter(args, table, stream);
  }
  Status health(DType dtype, const HealthTable& table, void* stream) override {
    return launch_health(dtype, table, stream);
  }
  Status preload(int* loaded) override { return preload_kernels(loaded); }
};

}  // namespace

std::unique_ptr<KernelLauncher> make_cuda_kernel_launcher() { return std::make_unique<CudaKernelLauncher>(); }

}  // namespace gradsync::cuda
