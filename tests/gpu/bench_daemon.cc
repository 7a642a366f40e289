// Device checks (b) and (c): gradsyncd and 2 trainer processes on one GPU. Each trainer
// allocates its gradients with the client library (VMM), registers them, and times
//   - steps of an avg-allreduce of one 100 MiB float32 tensor per trainer (2 x 100 MiB), and
//   - round trips of a 4 KiB avg-allreduce (submit -> completion seen by the trainer),
// each from the trainer's call to its Work::wait returning. Rank 0 also times, in the same
// run, the floor for the big step: one device-to-device copy of 2 x 100 MiB (reading and
// writing each byte once, as gather + scatter must at least).
// (c) the separate-context cost: a compute kernel in each trainer, timed alone and while the
// daemon runs 2 x 100 MiB allreduces for both trainers (without MPS the daemon's kernels
// time-slice with the trainers'; run it again under MPS to compare).
//
//   gradsync-gpu-daemon-bench --gradsyncd PATH [--steps N] [--round-trips N]
// Prints "daemon_bench: rank=R step_ms=... copy_floor_ms=... rt4k_p50_us=... rt4k_p99_us=...
// compute_ms=... compute_during_allreduce_ms=...".
// The parent never touches CUDA: the trainers fork from it.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <atomic>
#include <thread>

#include "client/tools/process.h"
#include "gradsync/client.h"
#include "tests/gpu/busy_kernel.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int trainer(const std::string& socket, const std::string& job, int rank, int steps, int round_trips, int report) {
  using namespace gradsync;
  auto client = Client::connect(ConnectOptions{.socket_path = socket, .client_name = "bench"});
  client->join(JoinOptions{.job_id = job, .rank = rank, .world_size = 2, .local_rank = rank, .local_world_size = 2,
                           .timeout = std::chrono::milliseconds(60'000)});
  const std::vector<TensorSpec> big = {{DType::kFloat32, (100u << 20) / 4, "dp"}};
  const std::vector<TensorSpec> small = {{DType::kFloat32, 1024, "dp"}};
  const std::vector<SharedTensor> big_tensors = client->allocate_device_flat(big, 0);
  const std::vector<SharedTensor> small_tensors = client->allocate_device_flat(small, 0);
  const TensorSet big_set = client->register_tensors(big_tensors, {});
  const TensorSet small_set = client->register_tensors(small_tensors, {});
  const ReduceOptions avg{ReduceOp::kAvg};
  const auto timed = [&](const TensorSet& set) {
    const auto start = Clock::now();
    if (!client->allreduce(set, avg).wait(std::chrono::seconds(60))) throw std::runtime_error("a step timed out");
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };
  for (int i = 0; i < 3; ++i) timed(big_set);  // warm-up: tables, bucket buffers
  std::vector<double> step_us, rt_us;
  for (int i = 0; i < steps; ++i) step_us.push_back(timed(big_set));
  for (int i = 0; i < 20; ++i) timed(small_set);
  for (int i = 0; i < round_trips; ++i) rt_us.push_back(timed(small_set));
  // (c): a compute kernel alone, then while this trainer's allreduces run on the daemon. Both
  // trainers submit the same number of allreduces, so every one completes.
  double compute_ms = 0, compute_during_ms = 0;
  {
    const size_t elements = 16u << 20;
    float* work = nullptr;
    cudaStream_t compute = nullptr;
    if (cudaMalloc(&work, elements * sizeof(float)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) != cudaSuccess) {
      return 5;
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const auto time_kernel = [&] {
      cudaEventRecord(a, compute);
      gradsync::bench::launch_busy(work, elements, 200, compute);
      cudaEventRecord(b, compute);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      return static_cast<double>(ms);
    };
    for (int i = 0; i < 3; ++i) time_kernel();
    std::vector<double> alone, during;
    // A small allreduce is a barrier: both trainers time "alone" together, and then "during"
    // together, so neither's samples fall into the other's phase.
    timed(small_set);
    for (int i = 0; i < steps; ++i) alone.push_back(time_kernel());
    timed(small_set);
    std::atomic<bool> reducing{true};
    std::thread reducer([&] {
      for (int i = 0; i < steps; ++i) client->allreduce(big_set, avg).wait(std::chrono::seconds(60));
      reducing = false;
    });
    while (reducing.load()) during.push_back(time_kernel());
    reducer.join();
    compute_ms = median(alone);
    compute_during_ms = during.empty() ? -1 : median(during);  // -1: no sample, printed as missing
    cudaFree(work);
    cudaStreamDestroy(compute);
  }
  double copy_ms = 0;
  if (rank == 0) {
    // The floor, in this process and this run: one D2D copy of both trainers' bytes.
    void *from = nullptr, *to = nullptr;
    const size_t bytes = 2 * (100u << 20);
    if (cudaMalloc(&from, bytes) != cudaSuccess || cudaMalloc(&to, bytes) != cudaSuccess) return 3;
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<double> copies;
    for (int i = 0; i < steps + 3; ++i) {
      cudaEventRecord(a);
      cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (i >= 3) copies.push_back(ms);
    }
    copy_ms = median(copies);
    cudaFree(from);
    cudaFree(to);
  }
  char line[512];
  const int n = std::snprintf(line, sizeof line,
                              "daemon_bench: rank=%d step_ms=%.3f copy_floor_ms=%.3f rt4k_p50_us=%.1f "
                              "rt4k_p99_us=%.1f compute_ms=%.3f compute_during_allreduce_ms=%.3f\n",
                              rank, median(step_us) / 1000.0, copy_ms, median(rt_us), percentile(rt_us, 0.99),
                              compute_ms, compute_during_ms);
  if (write(report, line, static_cast<size_t>(n)) != n) return 4;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string gradsyncd;
  int steps = 20, round_trips = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--gradsyncd") == 0) gradsyncd = argv[i + 1];
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--round-trips") == 0) round_trips = std::max(1, std::atoi(argv[i + 1]));
  }
  if (gradsyncd.empty()) {
    std::fprintf(stderr, "usage: gradsync-gpu-daemon-bench --gradsyncd PATH [--steps N] [--round-trips N]\n");
    return 2;
  }
  try {
    gradsync::DaemonProcess daemon({.binary = gradsyncd, .extra_args = {}, .log_file = "/tmp/gradsync-daemon-bench.log"});
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return 1;
    std::vector<pid_t> children;
    for (int rank = 0; rank < 2; ++rank) {
      const pid_t pid = fork();
      if (pid == 0) {
        close(pipe_fds[0]);
        int code = 1;
        try {
          code = trainer(daemon.socket_path(), "daemon-bench", rank, steps, round_trips, pipe_fds[1]);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "daemon_bench: rank %d failed: %s\n", rank, e.what());
        }
        _exit(code);
      }
      children.push_back(pid);
    }
    close(pipe_fds[1]);
    std::string out;
    char buffer[512];
    ssize_t got = 0;
    while ((got = read(pipe_fds[0], buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(got));
    int failed = 0;
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      failed += gradsync::exited_ok(status) ? 0 : 1;
    }
    std::fputs(out.c_str(), stdout);
    if (failed) std::fprintf(stderr, "daemon_bench: %d trainer(s) failed; daemon log in /tmp/gradsync-daemon-bench.log\n", failed);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "daemon_bench: %s\n", e.what());
    return 1;
  }
}
