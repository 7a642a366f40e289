// Containment on a GPU that several jobs share, through the fake device (fake_device.h): one
// job's stuck or broken work must not stall or fail another's, every call names the device
// of what it touches, and device-ordered buckets that cross GPUs are answered at enqueue, with
// their failures reaching the job afterwards.
#include <atomic>
#include <thread>

#include "cuda_fixture.h"

namespace gradsync::cuda {
namespace {

using namespace testing;
using namespace std::chrono_literals;

// Every client's event rings for `f`'s set made through `api` (a GPU another job shares), named
// "<job>-ready-<client>.<slot>" and "<job>-done-<client>.<slot>".
void add_event_rings_on(Fixture& f, HostBackedDeviceApi& api, const std::string& job) {
  auto set = std::make_shared<TensorSet>(*f.set);
  for (int c = 0; c < kClients; ++c) {
    const int device = f.devices[static_cast<size_t>(c)];
    std::unique_ptr<EventRing> ready, done;
    api.name_prefix = job + "-ready-" + std::to_string(c);
    REQUIRE(EventRing::create(&api, device, &ready).ok());
    api.name_prefix = job + "-done-" + std::to_string(c);
    REQUIRE(EventRing::create(&api, device, &done).ok());
    set->events.push_back(std::make_shared<ClientEventRings>(device, std::move(ready), std::move(done)));
  }
  f.set = set;
}

CudaExecutorOptions on_shared_gpu(HostBackedDeviceApi& api, Fixture& f, GpuWatch* gpus = nullptr,
                                  std::function<void(const Status&)> fail_job = {}) {
  CudaExecutorOptions options = options_for(f, nullptr, gpus, std::move(fail_job));
  options.api = &api;
  return options;
}

}  // namespace

TEST_CASE("containment: a job whose client's ready event never fires does not delay another job's buckets on "
          "the same GPU",
          "[cuda][executor][containment]") {
  Fixture a(DType::kFloat32), b(DType::kFloat32);
  HostBackedDeviceApi& gpu = a.api;  // GPU 0 of one daemon, shared by both jobs
  add_event_rings_on(a, gpu, "a");
  add_event_rings_on(b, gpu, "b");
  gpu.never_fires.insert("a-ready-0.1");  // job A's rank 0 never reaches operation 1's mark
  CudaExecutor job_a(on_shared_gpu(gpu, a));
  CudaExecutor job_b(on_shared_gpu(gpu, b));
  LocalRendezvous local;
  SetAdmission admission{"a", &local, &a.topology};
  admission.execution_timeout = 3s;
  REQUIRE(job_a.admit(*a.set, admission).ok());
  REQUIRE(job_b.admit(*b.set, SetAdmission{"b", &local, &b.topology}).ok());

  // Job A's worker waits (bounded) for its client; job B's runs meanwhile, on the same GPU.
  std::atomic<bool> a_answered{false};
  Status a_answer;
  std::thread worker_a([&] {
    job_a.launch(a.call(OpKind::kAllreduce, 1), [&](const Status& s) {
      a_answer = s;
      a_answered = true;
    });
  });
  const auto started = std::chrono::steady_clock::now();
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    for (size_t bucket = 0; bucket < b.set->plan.buckets.size(); ++bucket) {
      Status answer = Status::internal("not answered");
      job_b.launch(b.call(OpKind::kAllreduce, seq, bucket), [&](const Status& s) { answer = s; });
      REQUIRE(answer.ok());
    }
  }
  const auto b_took = std::chrono::steady_clock::now() - started;
  const bool a_still_waiting = !a_answered.load();
  worker_a.join();
  CHECK(a_still_waiting);  // B's ten steps were through while A still waited for its client
  CHECK(b_took < 1s);
  CHECK(b.kernels.gathers == 10 * static_cast<int>(b.set->plan.buckets.size()));
  CHECK(a_answer.code() == ErrorCode::kTimeout);
  CHECK_THAT(a_answer.message(), Catch::Contains("local rank 0 announced its tensors of operation 1 ready"));
  // No stream ever waited on a client's event (a killed client's record never runs, and the
  // wait would stay in the shared context for good), nothing synchronised a stuck stream, and
  // every call named its object's device.
  CHECK(gpu.client_event_waits == 0);
  CHECK(gpu.stuck_synchronizations == 0);
  CHECK(gpu.wrong_device_calls == 0);
  // A fails; its drain is bounded (nothing of A's waits on its client).
  CHECK(job_a.quiesce(std::chrono::steady_clock::now() + 1s));
}

TEST_CASE("containment: a sticky CUDA error fails every job on that GPU, and only those, the daemon hears once",
          "[cuda][executor][containment]") {
  Fixture a(DType::kFloat32), b(DType::kFloat32), c(DType::kFloat32, {1, 1, 1});
  HostBackedDeviceApi& gpus_api = a.api;  // one daemon: GPUs 0 and 1
  add_event_rings_on(a, gpus_api, "a");
  add_event_rings_on(b, gpus_api, "b");
  add_event_rings_on(c, gpus_api, "c");
  std::vector<std::pair<int, std::string>> daemon_heard;
  GpuWatch watch([&](int device, const Status& why) { daemon_heard.emplace_back(device, why.message()); });
  std::vector<Status> failed_a, failed_b, failed_c;
  CudaExecutor job_a(on_shared_gpu(gpus_api, a, &watch, [&](const Status& s) { failed_a.push_back(s); }));
  CudaExecutor job_b(on_shared_gpu(gpus_api, b, &watch, [&](const Status& s) { failed_b.push_back(s); }));
  CudaExecutor job_c(on_shared_gpu(gpus_api, c, &watch, [&](const Status& s) { failed_c.push_back(s); }));
  // Each job has run on its GPU.
  for (auto* job : {&job_a, &job_b, &job_c}) {
    Fixture& f = job == &job_a ? a : job == &job_b ? b : c;
    REQUIRE(f.run(*job, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  }
  // A kernel of job A faults on GPU 0: the context there is broken for every later call.
  gpus_api.break_device(0, "a sticky CUDA error broke gradsyncd's context on it (cudaErrorIllegalAddress)");
  const Status answer = a.run(job_a, OpKind::kAllreduce, reduce::KernelArgs{});
  CHECK_THAT(answer.message(), Catch::Contains("GPU 0 is unusable: a sticky CUDA error"));
  // Job B on the same GPU fails with the same cause without having to run anything...
  REQUIRE(failed_b.size() == 1);
  CHECK_THAT(failed_b[0].message(), Catch::StartsWith("GPU 0 is unusable"));
  CHECK_THAT(b.run(job_b, OpKind::kAllreduce, reduce::KernelArgs{}).message(),
             Catch::StartsWith("GPU 0 is unusable"));
  // ...job C on GPU 1 runs on, and the daemon heard once, of GPU 0.
  CHECK(failed_c.empty());
  CHECK(c.run(job_c, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  REQUIRE(daemon_heard.size() == 1);
  CHECK(daemon_heard[0].first == 0);
  watch.report(0, Status::internal("again"));
  CHECK(daemon_heard.size() == 1);
}

TEST_CASE("pipelining: device-ordered buckets across GPUs are answered at enqueue, several in flight, and a "
          "failure reaches the job afterwards",
          "[cuda][executor][nccl][pipelining]") {
  Fixture f(DType::kFloat32, {0, 0, 1});
  add_event_rings(f);
  HostDeviceEngines engines;
  std::vector<Status> job_failures;
  CudaExecutor executor(options_for(f, &engines, nullptr, [&](const Status& s) { job_failures.push_back(s); }));
  LocalRendezvous local;
  REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
  HostDeviceEngine& engine = *engines.made.at(0);
  // Every bucket of two operations: each is answered once it is queued, and the engine's
  // watchdog follows all of them at once (the fake answers only when told to).
  size_t launched = 0;
  for (uint64_t seq = 1; seq <= 2; ++seq) {
    for (size_t bucket = 0; bucket < f.set->plan.buckets.size(); ++bucket) {
      std::optional<Status> answer;
      executor.launch(f.call(OpKind::kAllreduce, seq, bucket), [&](const Status& s) { answer = s; });
      REQUIRE(answer.has_value());
      CHECK(answer->ok());
      ++launched;
    }
  }
  REQUIRE(launched >= 4);
  CHECK(engine.pending.size() == launched);  // all in flight
  CHECK(f.api.synchronizations == 0);
  CHECK(job_failures.empty());
  // The GPUs get through the first; the second fails in NCCL.
  REQUIRE(engine.finish());
  CHECK(job_failures.empty());
  const Status nccl_error = Status::peer_lost("NCCL allreduce bucket 1 of set 0: remote process exited");
  engine.fail_oldest(nccl_error);
  REQUIRE(job_failures.size() == 1);
  CHECK(job_failures[0].message() == nccl_error.message());
  CHECK(f.api.wrong_device_calls == 0);
  // The job's drain: the queued buckets are through (or aborted), and their sets go.
  CHECK(executor.quiesce(std::chrono::steady_clock::now() + 1s));
}

TEST_CASE("pipelining: a bucket's tables are all uploaded before its collective is queued",
          "[cuda][executor][nccl][pipelining]") {
  // A table's first upload, from pageable memory, may wait for the work already on the stream;
  // queued after the collective, that would be waiting for the peers.
  Fixture f(DType::kFloat32, {0, 0, 1});
  add_event_rings(f);
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
  HostDeviceEngine& engine = *engines.made.at(0);
  int uploads_at_collective = -1;
  engine.on_collective = [&] { uploads_at_collective = f.api.uploads; };
  std::optional<Status> answer;
  executor.launch(f.call(OpKind::kAllreduce, 1), [&](const Status& s) { answer = s; });
  REQUIRE(answer.has_value());
  CHECK(answer->ok());
  CHECK(uploads_at_collective > 0);
  CHECK(f.api.uploads == uploads_at_collective);  // none after it
}

}  // namespace gradsync::cuda
