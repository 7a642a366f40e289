// The end-to-end GPU tests' main. They fork client processes that use CUDA, and a process that
// initialised CUDA must not fork children that use it, so the device probe runs in a child of
// its own. Without a usable device the run exits 77, which CTest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  const pid_t probe = ::fork();
  if (probe == 0) {
    int devices = 0;
    const cudaError_t error = cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || devices == 0) {
      std::printf("skipped: no usable CUDA device (%s)\n",
                  error != cudaSuccess ? cudaGetErrorString(error) : "the driver reports 0 devices");
      std::fflush(stdout);  // _exit does not flush
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  if (probe < 0 || ::waitpid(probe, &status, 0) != probe || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 77;
  return Catch::Session().run(argc, argv);
}
