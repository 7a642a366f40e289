// The client's one place that knows whether it was built with CUDA.
#include "client/src/device_memory.h"

#include <string>

#if GRADSYNC_HAVE_CUDA
#include "client/src/cuda_vmm.h"
#endif

namespace gradsync {
namespace {

constexpr const char* kNoCuda =
    "this client library was built without CUDA support (the quick start's build leaves it out; build with "
    ".ci/build, or cmake -DGRADSYNC_CUDA=AUTO with nvcc and NCCL)";

class NoDeviceMemory final : public DeviceMemory {
 public:
  Status allocate(int, size_t, std::unique_ptr<DeviceAllocation>*) override {
    return Status::not_supported("device memory: " + std::string(kNoCuda));
  }
  Status describe_foreign(int, void*, size_t, std::unique_ptr<DeviceAllocation>*, std::string*, uint64_t*) override {
    return Status::not_supported("device memory: " + std::string(kNoCuda));
  }
  Status open_events(int, const std::vector<std::string>&, const std::vector<std::string>&,
                     std::unique_ptr<DeviceEvents>*) override {
    return Status::not_supported("device events: " + std::string(kNoCuda));
  }
  Status copy_to_host(int, void*, const void*, size_t, void*) override {
    return Status::not_supported("device memory: " + std::string(kNoCuda));
  }
};

}  // namespace

std::unique_ptr<DeviceMemory> make_device_memory() {
#if GRADSYNC_HAVE_CUDA
  return make_cuda_vmm_memory();
#else
  return std::make_unique<NoDeviceMemory>();
#endif
}

}  // namespace gradsync
