#include "daemon/backend/cuda/device.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>

namespace gradsync::cuda {
namespace {

bool driver_loadable() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver == nullptr) return false;
  ::dlclose(driver);
  return true;
}

}  // namespace

Status probe_devices(std::string* summary, int* devices) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    // The runtime reports a driver it cannot load as "insufficient": with no driver at all,
    // say so, rather than send the operator to upgrade one that is not there.
    if (error == cudaErrorInsufficientDriver && !driver_loadable()) {
      return Status::not_supported("no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)");
    }
    return Status::not_supported(std::string("the CUDA driver says: ") + cudaGetErrorString(error));
  }
  if (count == 0) return Status::not_supported("the CUDA driver sees no device");
  *devices = count;
  *summary = std::to_string(count) + (count == 1 ? " device:" : " devices:");
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, d) != cudaSuccess) continue;
    char line[384];
    std::snprintf(line, sizeof(line), "%s %d %.200s, sm_%d%d, %.1f GiB", d == 0 ? "" : ";", d, props.name, props.major,
                  props.minor, static_cast<double>(props.totalGlobalMem) / (1ull << 30));
    *summary += line;
  }
  return Status();
}

}  // namespace gradsync::cuda
