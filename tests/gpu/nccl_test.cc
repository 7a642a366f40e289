// The NCCL engine on a real GPU with the machine's NCCL: a single-rank communicator (one H200
// means one rank per process), created non-blocking, an out-of-place allreduce through it (an
// in-place one of a single rank is a no-op in NCCL, so only out of place does a kernel run and
// the data check mean something) whose done event the watchdog polls, a bucket whose stream is
// stuck, which the watchdog times out and aborts, and an abort while a collective waits behind
// a kernel in flight, and a communicator split off another with shared resources (the
// non-blocking ncclCommSplit, whose child NCCL fills only when the parent leaves "in progress").
// Prints the communicator's creation and split times for the device check's table (d).
//
// What one GPU cannot cover: a communicator of two ranks or more (NCCL refuses two ranks on one
// GPU), so the multi-GPU and multi-node paths run here only through the host fakes.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <thread>
#include <tuple>
#include <vector>

#include "daemon/engine/nccl/engine.h"
#include "tests/gpu/busy_kernel.h"

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

// The machine's NCCL, counting aborts and ready communicators, so the tests see what the
// engine did to it.
class CountingNccl final : public NcclApi {
 public:
  explicit CountingNccl(std::unique_ptr<NcclApi> real) : real_(std::move(real)) {}
  Status load() override { return real_->load(); }
  Status unique_id(UniqueId* id) override { return real_->unique_id(id); }
  Status init_rank(int device, int ranks, const UniqueId& id, int rank, void** comm) override {
    return real_->init_rank(device, ranks, id, rank, comm);
  }
  Status split(void* parent, int device, int color, int key, void** comm) override {
    ++splits;
    return real_->split(parent, device, color, key, comm);
  }
  CommState state(void* comm, Status* error) override {
    const CommState s = real_->state(comm, error);
    if (s == CommState::kReady) ++ready_polls;
    return s;
  }
  void abort(void* comm) override {
    ++aborts;
    real_->abort(comm);
  }
  Status group_start() override { return real_->group_start(); }
  Status group_end() override { return real_->group_end(); }
  Status all_reduce(const void* s, void* r, size_t n, DType t, reduce::Combine op, void* c, void* st) override {
    ++collectives;
    return real_->all_reduce(s, r, n, t, op, c, st);
  }
  Status broadcast(const void* s, void* r, size_t n, DType t, int root, void* c, void* st) override {
    return real_->broadcast(s, r, n, t, root, c, st);
  }
  Status reduce(const void* s, void* r, size_t n, DType t, reduce::Combine op, int root, void* c, void* st) override {
    return real_->reduce(s, r, n, t, op, root, c, st);
  }
  Status all_gather(const void* s, void* r, size_t n, DType t, void* c, void* st) override {
    return real_->all_gather(s, r, n, t, c, st);
  }
  Status reduce_scatter(const void* s, void* r, size_t n, DType t, reduce::Combine op, void* c, void* st) override {
    return real_->reduce_scatter(s, r, n, t, op, c, st);
  }
  Status register_buffer(void* c, void* d, size_t b, void** h) override { return real_->register_buffer(c, d, b, h); }
  Status deregister_buffer(void* c, void* h) override { return real_->deregister_buffer(c, h); }

  std::atomic<int> aborts{0};
  std::atomic<int> ready_polls{0};
  std::atomic<int> collectives{0};
  std::atomic<int> splits{0};

 private:
  std::unique_ptr<NcclApi> real_;
};

// GPU 0 made current, a non-blocking stream, an event, and two buffers of `count` floats (an
// output and an out-of-place input), released when the test ends, however it ends.
class GpuScratch {
 public:
  explicit GpuScratch(size_t count) {
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    CUDA_OK(cudaMalloc(&data_, count * sizeof(float)));
    CUDA_OK(cudaMalloc(&input_, count * sizeof(float)));
  }
  ~GpuScratch() {
    if (data_) cudaFree(data_);
    if (input_) cudaFree(input_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  GpuScratch(const GpuScratch&) = delete;
  GpuScratch& operator=(const GpuScratch&) = delete;
  std::tuple<cudaStream_t, cudaEvent_t, float*, float*> parts() const { return {stream_, done_, data_, input_}; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  float* data_ = nullptr;
  float* input_ = nullptr;
};

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

// A smoke test of the real library through the engine: a one-rank allreduce is the identity,
// done out of place, so NCCL must move the input into an output that held a marker: NCCL
// loads, the non-blocking init and group call complete, the data moves, and the watchdog
// answers a real event. (For a single-rank sum NCCL 2.2x moves it with an async copy in
// ncclLaunchOneRank, not a reduction kernel: one GPU cannot run NCCL's reduction kernels.)
TEST_CASE("nccl on one GPU: a single-rank communicator allreduces out of place, and the watchdog answers its "
          "done event",
          "[gpu][nccl]") {
  CountingNccl counting(make_nccl_api());
  NcclApi* api = &counting;
  constexpr size_t kCount = 1 << 20;
  GpuScratch gpu(kCount);
  auto [stream, done, data, input] = gpu.parts();
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 1000) * 0.5f;
  CUDA_OK(cudaMemcpy(input, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(data, 0xff, kCount * sizeof(float)));  // NaNs: what no copy would leave
  {
    NcclEngine engine(api, one_gpu());
    LocalRendezvous local;
    const auto started = std::chrono::steady_clock::now();
    const Status connected = engine.connect(&local);
    const double init_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    INFO(connected.message());
    REQUIRE(connected.ok());
    std::printf("nccl: single-rank communicator created in nccl_init_ms=%.1f\n", init_ms);
    REQUIRE(engine.ranks() == 1);
    const DeviceBuffer buffer{0, data, stream, input};
    REQUIRE(engine.allreduce(std::span(&buffer, 1), kCount, ReduceSpec{}).ok());
    CUDA_OK(cudaEventRecord(done, stream));
    auto answer = watch_event(engine, done, 10'000ms);
    REQUIRE(answer.wait_for(10s) == std::future_status::ready);
    CHECK(answer.get().ok());
    std::vector<float> back(kCount);
    CUDA_OK(cudaMemcpy(back.data(), data, kCount * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(back == host);  // one rank: the sum is the input, now in the output
    CHECK(counting.collectives == 1);
    CHECK(counting.ready_polls >= 2);  // the init and the group call were each seen through
    bool registered = false;
    const Status reg = engine.register_buffer(0, data, kCount * sizeof(float), &registered);
    std::printf("nccl: ncclCommRegister of a cudaMalloc buffer: %s\n", reg.ok() ? "registered" : reg.message().c_str());
  }
  CHECK(counting.aborts == 1);  // ended by the engine's destructor
}

// The stream is held before the collective (a single rank has no peer to wait on), so this
// shows the watchdog's deadline and its abort of the real communicator, not NCCL returning from
// an aborted kernel.
TEST_CASE("nccl on one GPU: a bucket whose stream is stuck times out, and the communicator is aborted",
          "[gpu][nccl]") {
  CountingNccl counting(make_nccl_api());
  NcclApi* api = &counting;
  GpuScratch gpu(1024);
  auto [stream, done, data, input] = gpu.parts();
  {
    NcclEngine engine(api, one_gpu());
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
    // Not before the deadline, and not much after the stream frees up: ncclCommAbort (2.28.9,
    // measured on an H200) synchronises the stream, so it returns, and the watchdog answers,
    // once the work queued before NCCL's is through (NVIDIA/nccl#829). The daemon's streams
    // hold only its own bounded kernels and NCCL's, which the abort stops (docs/gpu.md).
    const auto answered = std::chrono::steady_clock::now() - started;
    std::printf("nccl: stuck stream: the timeout was answered after abort_answer_ms=%.1f (deadline 200 ms, stream "
                "held 1500 ms)\n", std::chrono::duration<double, std::milli>(answered).count());
    CHECK(answered >= 200ms);
    CHECK(answered < 3000ms);
    CHECK(counting.aborts == 1);  // by the watchdog, before it answered
    // Sticky: the engine refuses more work.
    CHECK(engine.allreduce(std::span(&buffer, 1), 1024, ReduceSpec{}).code() == ErrorCode::kTimeout);
  }
  CHECK(counting.aborts == 1);  // and not again when the engine goes
  CUDA_OK(cudaStreamSynchronize(stream));  // drains once the host function returns
}

// The usual shape of a hang on a GPU: the stream is busy with a kernel, and the collective waits
// behind it. The watchdog aborts the communicator while that kernel runs and the collective's
// work is still queued. ncclCommAbort returns only once the kernel ends (it synchronises the
// stream: seen on an H200 with NCCL 2.28.9, where an earlier version of this test expected it
// back while the kernel ran); then the stream must drain without an error and the daemon's
// context must still work (an abort that left a sticky error would break every job on the GPU). On one GPU the queued work
// is NCCL's single-rank copy, so what happens to a multi-rank kernel whose communicator was
// aborted under it is not covered here.
TEST_CASE("nccl on one GPU: an abort while a collective waits behind a running kernel leaves the GPU usable",
          "[gpu][nccl]") {
  CountingNccl counting(make_nccl_api());
  NcclApi* api = &counting;
  constexpr size_t kCount = 1 << 18;
  GpuScratch gpu(kCount);
  auto [stream, done, data, input] = gpu.parts();
  CUDA_OK(cudaMemset(input, 0, kCount * sizeof(float)));
  {
    NcclEngine engine(api, one_gpu());
    LocalRendezvous local;
    REQUIRE(engine.connect(&local).ok());
    REQUIRE(bench::launch_spin(1500, stream));  // a kernel in flight for 1.5 s
    const DeviceBuffer buffer{0, data, stream, input};
    REQUIRE(engine.allreduce(std::span(&buffer, 1), kCount, ReduceSpec{}).ok());  // queued behind it
    CUDA_OK(cudaEventRecord(done, stream));
    const auto started = std::chrono::steady_clock::now();
    auto answer = watch_event(engine, done, 200ms);
    REQUIRE(answer.wait_for(5s) == std::future_status::ready);
    const Status status = answer.get();
    CHECK(status.code() == ErrorCode::kTimeout);
    // After the deadline, and once the running kernel ends (the abort synchronises the stream,
    // as above), not at the 5 s wait.
    const auto answered = std::chrono::steady_clock::now() - started;
    CHECK(answered >= 200ms);
    CHECK(answered < 3000ms);
    CHECK(counting.aborts == 1);
  }
  const auto drain_started = std::chrono::steady_clock::now();
  const cudaError_t drained = cudaStreamSynchronize(stream);
  const double drain_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - drain_started).count();
  std::printf("nccl: abort behind a running kernel: the stream drained in abort_drain_ms=%.1f with %s\n", drain_ms,
              cudaGetErrorString(drained));
  INFO(cudaGetErrorString(drained));
  CHECK(drained == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  // The context still works.
  const float three = 3.0f;
  float back = 0.0f;
  CUDA_OK(cudaMemcpy(data, &three, sizeof three, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(&back, data, sizeof back, cudaMemcpyDeviceToHost));
  CHECK(back == 3.0f);
}

// A job whose trainer restarts: the engine of its first run goes idle, its communicator is kept,
// and the next run's engine re-joins it. Prints both times for the device check's table (d).
TEST_CASE("nccl on one GPU: a restarted job re-joins its kept communicator instead of creating one",
          "[gpu][nccl][rejoin]") {
  CountingNccl counting(make_nccl_api());
  NcclApi* api = &counting;
  CommPark park(api, 60'000ms);
  DeviceEngineSpec spec = one_gpu();
  spec.reuse_key = "job gpu-test/nccl/gpu-test";
  GpuScratch gpu(1024);
  auto [stream, done, data, input] = gpu.parts();
  const DeviceBuffer buffer{0, data, stream};
  const auto run = [&](bool expect_reused, double* connect_ms) {
    NcclEngine engine(api, spec, EngineTiming{}, &park);
    LocalRendezvous local;
    const auto started = std::chrono::steady_clock::now();
    const Status connected = engine.connect(&local);
    *connect_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    INFO(connected.message());
    REQUIRE(connected.ok());
    CHECK(engine.reused() == expect_reused);
    REQUIRE(engine.allreduce(std::span(&buffer, 1), 1024, ReduceSpec{}).ok());
    CUDA_OK(cudaEventRecord(done, stream));
    auto answer = watch_event(engine, done, 10'000ms);
    REQUIRE(answer.wait_for(10s) == std::future_status::ready);
    CHECK(answer.get().ok());
    engine.abort(Status::peer_lost("the trainer died"));  // idle: the communicator is kept
  };
  double fresh_ms = 0, rejoin_ms = 0;
  run(false, &fresh_ms);
  CHECK(park.size() == 1);
  run(true, &rejoin_ms);
  CHECK(park.size() == 1);
  CHECK(counting.aborts == 0);
  std::printf("nccl: communicator of a restarted job re-joined in nccl_rejoin_ms=%.3f (created fresh in %.1f ms)\n",
              rejoin_ms, fresh_ms);
}

// A group split off the job's communicator (ncclCommSplit with splitShare, non-blocking): the
// child is NCCL's, not null, it moves data, the parent still does, and both are ended. On one
// GPU the child has one rank, like its parent; the NOCOLOR side of a split needs two GPUs.
TEST_CASE("nccl on one GPU: a communicator split off another shares its resources and moves data",
          "[gpu][nccl][split]") {
  CountingNccl counting(make_nccl_api());
  NcclApi* api = &counting;
  constexpr size_t kCount = 1 << 16;
  GpuScratch gpu(kCount);
  auto [stream, done, data, input] = gpu.parts();
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 77);
  CUDA_OK(cudaMemcpy(input, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  const DeviceBuffer buffer{0, data, stream, input};
  const auto moves_data = [&](NcclEngine& engine) {
    CUDA_OK(cudaMemset(data, 0xff, kCount * sizeof(float)));
    REQUIRE(engine.allreduce(std::span(&buffer, 1), kCount, ReduceSpec{}).ok());
    CUDA_OK(cudaEventRecord(done, stream));
    auto answer = watch_event(engine, done, 10'000ms);
    REQUIRE(answer.wait_for(10s) == std::future_status::ready);
    CHECK(answer.get().ok());
    std::vector<float> back(kCount);
    CUDA_OK(cudaMemcpy(back.data(), data, kCount * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(back == host);
  };
  {
    NcclEngine parent(api, one_gpu());
    LocalRendezvous local;
    REQUIRE(parent.connect(&local).ok());
    REQUIRE(parent.splittable());
    moves_data(parent);
    DeviceEngineSpec spec = one_gpu();
    spec.what = "gpu test child";
    spec.name = "nccl/gpu-test-child";
    spec.parent = &parent;
    NcclEngine child(api, spec);
    const auto started = std::chrono::steady_clock::now();
    const Status connected = child.connect(&local);
    const double split_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    INFO(connected.message());
    REQUIRE(connected.ok());
    CHECK(counting.splits == 1);
    std::printf("nccl: communicator split off another (shared resources) in nccl_split_ms=%.1f\n", split_ms);
    moves_data(child);
    moves_data(parent);
  }
  CHECK(counting.aborts == 2);  // a family is never kept: both ended
}

}  // namespace gradsync::nccl
