#include "tests/gpu/busy_kernel.h"

#include <cuda_runtime.h>

namespace gradsync::bench {
namespace {

__global__ void busy(float* data, size_t elements, int rounds) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < elements;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float x = data[i];
    for (int r = 0; r < rounds; ++r) x = x * 0.999f + 0.001f;
    data[i] = x;
  }
}

}  // namespace

bool launch_busy(float* data, size_t elements, int rounds, void* stream) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  busy<<<sms * 4, 256, 0, static_cast<cudaStream_t>(stream)>>>(data, elements, rounds);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace gradsync::bench
