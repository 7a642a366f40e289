#include "daemon/backend/cuda/device.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace gradsync::cuda {

Status probe_devices(std::string* summary, int* devices) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
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
