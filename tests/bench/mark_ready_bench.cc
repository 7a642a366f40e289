// The C++ client's cost of marking tensors ready, the baseline for the Python layer's
// (tests/python/bench_overhead.py runs both against one daemon, in the same run).
//
//   gradsync-mark-ready-bench SOCKET JOB TENSORS STEPS
//
// One trainer (world size 1) registers TENSORS small tensors as one flat set; each step opens a
// deferred allreduce, marks every tensor ready (timed), and waits. Prints the median over the
// steps of the time per tensor marked: cpp_mark_ready_us=...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gradsync/client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: gradsync-mark-ready-bench SOCKET JOB TENSORS STEPS\n");
    return 2;
  }
  const int tensors = std::atoi(argv[3]), steps = std::atoi(argv[4]);
  if (tensors < 1 || steps < 1) {
    std::fprintf(stderr, "TENSORS and STEPS must be positive integers\n");
    return 2;
  }
  try {
    auto client = gradsync::Client::connect({.socket_path = argv[1]});
    client->join({.job_id = argv[2], .rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1});
    std::vector<gradsync::TensorSpec> specs(static_cast<size_t>(tensors), gradsync::TensorSpec{gradsync::DType::kFloat32, 1024});
    const auto grads = client->allocate_flat(specs);
    const gradsync::TensorSet set = client->register_tensors(grads, {});
    std::vector<double> per_tensor_us;
    for (int s = 0; s < steps; ++s) {
      gradsync::Work work = client->allreduce_deferred(set, {});
      const auto start = std::chrono::steady_clock::now();
      for (int i = tensors - 1; i >= 0; --i) client->mark_ready(set, static_cast<uint32_t>(i));
      const auto end = std::chrono::steady_clock::now();
      if (!work.wait(std::chrono::seconds(30))) throw gradsync::Error(gradsync::Status::timeout("step did not finish"));
      per_tensor_us.push_back(std::chrono::duration<double, std::micro>(end - start).count() / tensors);
    }
    std::sort(per_tensor_us.begin(), per_tensor_us.end());
    std::printf("cpp_mark_ready_us=%.3f\n", per_tensor_us[per_tensor_us.size() / 2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync-mark-ready-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
