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

__global__ void spin(unsigned long long nanoseconds) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

bool launch_spin(int milliseconds, void* stream) {
  spin<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned long long>(milliseconds) * 1'000'000ull);
  return cudaGetLastError() == cudaSuccess;
}

bool launch_busy(float* data, size_t elements, int rounds, void* stream) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  busy<<<sms * 4, 256, 0, static_cast<cudaStream_t>(stream)>>>(data, elements, rounds);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace gradsync::bench
