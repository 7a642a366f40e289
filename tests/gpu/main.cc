// The GPU tests' main: without a usable CUDA device there is nothing to test, and the run exits
// 77, which CTest reports as skipped (SKIP_RETURN_CODE), naming why.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("skipped: no usable CUDA device (%s)\n",
                error != cudaSuccess ? cudaGetErrorString(error) : "the driver reports 0 devices");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
