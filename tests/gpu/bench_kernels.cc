// gradsync-gpu-bench: the coalescing kernels on one GPU against their floor, in one run.
//   gather  = ResNet-50's 161 float32 gradient tensors -> one bucket buffer (flatten)
//   scatter = the bucket buffer -> the 161 tensors (unflatten and copy back)
// The floor is cudaMemcpyAsync device-to-device of the same bytes, twice (the gather and the
// scatter each read and write every byte once). Medians over --iterations, timed with CUDA
// events. torch's _flatten_dense_tensors/_unflatten_dense_tensors is timed by
// tests/device/torch_flatten.py in the same script run (tests/device/run.sh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/tools/model_layouts.h"
#include "daemon/backend/cuda/kernels.h"
#include "daemon/backend/cuda/work_items.h"

namespace {

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "gradsync-gpu-bench: %s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

double median(std::vector<float> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Times `body` (enqueued on the default stream) `iterations` times; median milliseconds.
template <typename Body>
double time_ms(int iterations, Body&& body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int warm = 0; warm < 3; ++warm) body();
  std::vector<float> samples;
  for (int i = 0; i < iterations; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    body();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    samples.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(samples);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 50;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::max(1, std::atoi(argv[i + 1]));
  }
  using namespace gradsync;
  const std::vector<TensorSpec> layout = resnet50_layout();
  // --print-layout: the element counts, one per line, for torch_flatten.py (needs no GPU).
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--print-layout") == 0) {
      for (const TensorSpec& spec : layout) std::printf("%llu\n", static_cast<unsigned long long>(spec.numel));
      return 0;
    }
  }
  std::vector<cuda::Segment> segments;
  std::vector<void*> tensors;
  uint64_t total = 0;
  for (const TensorSpec& spec : layout) {
    void* p = nullptr;
    check(cudaMalloc(&p, spec.numel * sizeof(float)), "cudaMalloc tensor");
    check(cudaMemset(p, 0x3c, spec.numel * sizeof(float)), "cudaMemset");
    tensors.push_back(p);
    cuda::Segment s;
    s.bucket_offset = total;
    s.count = spec.numel;
    s.address[0] = p;
    segments.push_back(s);
    total += spec.numel;
  }
  const std::vector<cuda::WorkItem> items = cuda::cut_into_items(segments);
  void *bucket = nullptr, *copy = nullptr, *d_segments = nullptr, *d_items = nullptr;
  check(cudaMalloc(&bucket, total * sizeof(float)), "cudaMalloc bucket");
  check(cudaMalloc(&copy, total * sizeof(float)), "cudaMalloc copy");
  check(cudaMalloc(&d_segments, segments.size() * sizeof(cuda::Segment)), "cudaMalloc table");
  check(cudaMalloc(&d_items, items.size() * sizeof(cuda::WorkItem)), "cudaMalloc table");
  check(cudaMemcpy(d_segments, segments.data(), segments.size() * sizeof(cuda::Segment), cudaMemcpyHostToDevice), "copy");
  check(cudaMemcpy(d_items, items.data(), items.size() * sizeof(cuda::WorkItem), cudaMemcpyHostToDevice), "copy");
  const cuda::BucketTable table{static_cast<const cuda::Segment*>(d_segments),
                                static_cast<const cuda::WorkItem*>(d_items), items.size(), 1, bucket};
  reduce::KernelArgs args;  // float32 sum of one client: a pure flatten and unflatten

  const double bytes = static_cast<double>(total) * sizeof(float);
  const double kernels = time_ms(iterations, [&] {
    if (!cuda::launch_gather(args, table, nullptr).ok() || !cuda::launch_scatter(args, table, nullptr).ok()) {
      std::fprintf(stderr, "gradsync-gpu-bench: launch failed\n");
      std::exit(1);
    }
  });
  const double floor = time_ms(iterations, [&] {
    check(cudaMemcpyAsync(copy, bucket, total * sizeof(float), cudaMemcpyDeviceToDevice), "memcpy");
    check(cudaMemcpyAsync(bucket, copy, total * sizeof(float), cudaMemcpyDeviceToDevice), "memcpy");
  });
  std::printf("resnet50: %zu tensors, %.1f MiB, %zu work items\n", layout.size(), bytes / (1 << 20), items.size());
  std::printf("gather+scatter median %.3f ms (%.0f GB/s moved, read+write)\n", kernels, 4 * bytes / kernels / 1e6);
  std::printf("2 x device-to-device copy median %.3f ms (%.0f GB/s)\n", floor, 4 * bytes / floor / 1e6);
  std::printf("raw: gpu-coalesce kernels_ms=%.4f copy_ms=%.4f fraction_of_copy_bandwidth=%.3f\n", kernels, floor,
              floor / kernels);
  return 0;
}
