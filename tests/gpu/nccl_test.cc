// The NCCL engine on a real GPU with the machine's NCCL: a single-rank communicator (one H200
// means one rank per process), created non-blocking, an allreduce through it whose done event
// the watchdog polls, and a bucket whose stream is stuck, which the watchdog times out and
// aborts. Prints the communicator's creation time for the device check's table (d).
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <vector>

#include "daemon/engine/nccl/engine.h"

namespace gradsync::nccl {
namespace {

using namespace std::chrono_literals;

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

DeviceEngineSpec one_gpu(std::chrono::milliseconds timeout = 60'000ms) {
  DeviceEngineSpec spec;
  spec.what = "gpu test";
  spec.name = "nccl/gpu-test";
  spec.devices = {0};
  spec.slot_of_local_rank = {0};
  spec.timeout = timeout;
  spec.single_rank_communicator = true;
  return spec;
}

// Answers with the watchdog's verdict on `event`.
std::future<Status> watch_event(NcclEngine& engine, cudaEvent_t event, std::chrono::milliseconds timeout) {
  auto answered = std::make_shared<std::promise<Status>>();
  engine.watch(
      "test bucket",
      [event](bool* done) {
        const cudaError_t e = cudaEventQuery(event);
        *done = e == cudaSuccess;
        return e == cudaSuccess || e == cudaErrorNotReady ? Status() : Status::internal(cudaGetErrorString(e));
      },
      timeout, [answered](const Status& s) { answered->set_value(s); });
  return answered->get_future();
}

}  // namespace

TEST_CASE("nccl on one GPU: a single-rank communicator allreduces, and the watchdog answers its done event",
          "[gpu][nccl]") {
  auto api = make_nccl_api();
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  constexpr size_t kCount = 1 << 20;
  float* data = nullptr;
  CUDA_OK(cudaMalloc(&data, kCount * sizeof(float)));
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 1000) * 0.5f;
  CUDA_OK(cudaMemcpy(data, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  {
    NcclEngine engine(api.get(), one_gpu());
    LocalRendezvous local;
    const auto started = std::chrono::steady_clock::now();
    const Status connected = engine.connect(&local);
    const double init_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    INFO(connected.message());
    REQUIRE(connected.ok());
    std::printf("nccl: single-rank communicator created in nccl_init_ms=%.1f\n", init_ms);
    REQUIRE(engine.ranks() == 1);
    const DeviceBuffer buffer{0, data, stream};
    REQUIRE(engine.allreduce(std::span(&buffer, 1), kCount, ReduceSpec{}).ok());
    CUDA_OK(cudaEventRecord(done, stream));
    auto answer = watch_event(engine, done, 10'000ms);
    REQUIRE(answer.wait_for(10s) == std::future_status::ready);
    CHECK(answer.get().ok());
    std::vector<float> back(kCount);
    CUDA_OK(cudaMemcpy(back.data(), data, kCount * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(back == host);  // one rank: the sum is the input
    bool registered = false;
    const Status reg = engine.register_buffer(0, data, kCount * sizeof(float), &registered);
    std::printf("nccl: ncclCommRegister of a cudaMalloc buffer: %s\n", reg.ok() ? "registered" : reg.message().c_str());
  }
  cudaFree(data);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
}

TEST_CASE("nccl on one GPU: a bucket whose stream is stuck times out, and the communicator is aborted",
          "[gpu][nccl]") {
  auto api = make_nccl_api();
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  float* data = nullptr;
  CUDA_OK(cudaMalloc(&data, 1024 * sizeof(float)));
  {
    NcclEngine engine(api.get(), one_gpu());
    LocalRendezvous local;
    REQUIRE(engine.connect(&local).ok());
    // The stream is held by a host function for 1.5 s: the "collective" behind it cannot finish.
    CUDA_OK(cudaLaunchHostFunc(
        stream, [](void*) { std::this_thread::sleep_for(1500ms); }, nullptr));
    const DeviceBuffer buffer{0, data, stream};
    REQUIRE(engine.allreduce(std::span(&buffer, 1), 1024, ReduceSpec{}).ok());
    CUDA_OK(cudaEventRecord(done, stream));
    const auto started = std::chrono::steady_clock::now();
    auto answer = watch_event(engine, done, 200ms);
    REQUIRE(answer.wait_for(5s) == std::future_status::ready);
    const Status status = answer.get();
    CHECK(status.code() == ErrorCode::kTimeout);
    CHECK_THAT(status.message(), Catch::Contains("did not finish within 200 ms"));
    CHECK(std::chrono::steady_clock::now() - started < 1400ms);  // not when the stream frees up
    // Sticky: the engine refuses more work.
    CHECK(engine.allreduce(std::span(&buffer, 1), 1024, ReduceSpec{}).code() == ErrorCode::kTimeout);
  }
  CUDA_OK(cudaStreamSynchronize(stream));  // drains once the host function returns
  cudaFree(data);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
}

}  // namespace gradsync::nccl
