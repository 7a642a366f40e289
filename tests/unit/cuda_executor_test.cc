// The CUDA executor on the host: its tables, launches and ordering, with host memory standing in
// for device memory and the kernels' functors run on the host (fake_device.h). Three clients
// share "GPU 0"; every operation it supports is checked bit for bit against the host reduction.
#include "cuda_fixture.h"

#include <cmath>
#include <thread>

#include "shared/half.h"

namespace gradsync::cuda {

using namespace testing;  // the fixture, the fake device and engines (cuda_fixture.h)

TEST_CASE("cuda executor: allreduce over clients sharing a GPU equals reduce(), every dtype and argument set",
          "[cuda][executor]") {
  for (DType dtype : reduce::cases::kAllDTypes) {
    for (const reduce::KernelArgs& args : reduce::cases::valid_args(dtype)) {
      Fixture f(dtype);
      {
        CudaExecutor executor(options_for(f, nullptr));
        INFO(reduce::cases::describe(args));
        REQUIRE(f.run(executor, OpKind::kAllreduce, args).ok());
        for (size_t t = 0; t < f.set->layout.size(); ++t) {
          const Bytes want = f.reduced(args, t);
          for (int c = 0; c < kClients; ++c) {
            INFO("client " << c << " tensor " << t);
            CHECK(reduce::cases::first_difference(f.tensor(c, t), want, dtype_size(dtype)) == "");
          }
        }
        // Every bucket waited for its stream before answering.
        CHECK(f.api.synchronizations == static_cast<int>(f.set->plan.buckets.size()));
      }
      CHECK(f.api.allocations.empty());  // tables and the bucket buffer freed with the executor
      CHECK(f.api.streams == 0);
    }
  }
}

TEST_CASE("cuda executor: tables are built once and reused every step", "[cuda][executor]") {
  Fixture f(DType::kFloat32);
  CudaExecutor executor(options_for(f, nullptr));
  REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  const int uploads = f.api.uploads;
  CHECK(uploads == 4 * static_cast<int>(f.set->plan.buckets.size()));  // gather and scatter: segments, items
  for (int step = 0; step < 3; ++step) REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  CHECK(f.api.uploads == uploads);
}

TEST_CASE("cuda executor: a retired set's tables are freed, and made again if needed",
          "[cuda][executor]") {
  Fixture f(DType::kFloat32);
  CudaExecutor executor(options_for(f, nullptr));
  REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  const size_t buckets = f.set->plan.buckets.size();
  const size_t allocated = f.api.allocations.size();  // the tables (4 per bucket) and the bucket buffer
  executor.retire_set(f.set->id + 1);                 // another set: nothing of this one goes
  CHECK(f.api.allocations.size() == allocated);
  executor.retire_set(f.set->id);
  CHECK(f.api.allocations.size() == allocated - 4 * buckets);  // gather and scatter: segments, items
  // A set of the same id later (not in a job: ids are never reused there) builds its own again.
  const int uploads = f.api.uploads;
  REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  CHECK(f.api.uploads == uploads + 4 * static_cast<int>(buckets));
  CHECK(f.api.allocations.size() == allocated);
}

TEST_CASE("cuda executor: reduce lands in the root only, broadcast copies the root's bytes exactly",
          "[cuda][executor]") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    Fixture f(dtype);
    CudaExecutor executor(options_for(f, nullptr));
    const reduce::KernelArgs sum{.dtype = dtype};
    REQUIRE(f.run(executor, OpKind::kReduce, sum, 1).ok());
    for (size_t t = 0; t < f.set->layout.size(); ++t) {
      CHECK(reduce::cases::first_difference(f.tensor(1, t), f.reduced(sum, t), dtype_size(dtype)) == "");
      CHECK(f.tensor(0, t) == f.original_tensor(0, t));  // non-roots untouched
      CHECK(f.tensor(2, t) == f.original_tensor(2, t));
    }
    REQUIRE(f.run(executor, OpKind::kBroadcast, sum, 2).ok());
    for (size_t t = 0; t < f.set->layout.size(); ++t) {
      for (int c = 0; c < kClients; ++c) CHECK(f.tensor(c, t) == f.original_tensor(2, t));
    }
    // Another root on the same set: its own tables, not the first root's (a review found the
    // root missing from the cache key).
    for (int c = 0; c < kClients; ++c) {  // in place: the set points into these buffers
      std::copy(f.original[static_cast<size_t>(c)].begin(), f.original[static_cast<size_t>(c)].end(),
                f.memory[static_cast<size_t>(c)].begin());
    }
    REQUIRE(f.run(executor, OpKind::kBroadcast, sum, 0).ok());
    for (size_t t = 0; t < f.set->layout.size(); ++t) {
      for (int c = 0; c < kClients; ++c) CHECK(f.tensor(c, t) == f.original_tensor(0, t));
    }
  }
}

TEST_CASE("cuda executor: what it cannot do is refused, naming it", "[cuda][executor]") {
  Fixture split(DType::kFloat32, {0, 1, 0});
  CudaExecutor executor(options_for(split, nullptr));
  // Two GPUs need an NCCL engine; a daemon without one says so at admission.
  LocalRendezvous local;
  const Status across_gpus = executor.admit(*split.set, SetAdmission{"j", &local, &split.topology});
  CHECK(across_gpus.code() == ErrorCode::kNotSupported);
  CHECK_THAT(across_gpus.message(), Catch::Contains("job j set 0 group 'dp' spans 2 GPUs here and 1 nodes; this "
                                                    "gradsyncd has no NCCL engine"));
  Fixture f(DType::kFloat32);
  CudaExecutor second(options_for(f, nullptr));
  REQUIRE(second.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());  // one GPU: no engine needed
  // The worker refuses allgather on a set without outputs first; the executor double-checks.
  CHECK(f.run(second, OpKind::kAllgather, reduce::KernelArgs{}).message() ==
        "bucket 0 of set 0 was registered without allgather outputs");
  second.abort(Status::aborted("job j failed"));
  CHECK(f.run(second, OpKind::kAllreduce, reduce::KernelArgs{}).message() == "job j failed");
  CHECK(f.kernels.gathers == 0);  // nothing was launched for refused or aborted buckets
}


TEST_CASE("cuda executor: clients on two GPUs go through the device engine and equal reduce() bit for bit",
          "[cuda][executor][nccl]") {
  // Clients 0 and 1 share GPU 0, client 2 has GPU 1: GPU 0's kernel combines 0 and 1, the engine
  // adds GPU 1's, which is the host path's rank order.
  for (DType dtype : reduce::cases::kAllDTypes) {
    for (const reduce::KernelArgs& args : reduce::cases::valid_args(dtype)) {
      INFO(reduce::cases::describe(args));
      Fixture f(dtype, {0, 0, 1});
      HostDeviceEngines engines;
      {
        CudaExecutor executor(options_for(f, &engines));
        LocalRendezvous local;
        REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
        REQUIRE(engines.made.size() == 1);
        CHECK(engines.made[0]->spec.devices == std::vector<int>{0, 1});
        CHECK(engines.made[0]->spec.slot_of_local_rank == std::vector<int>{0, 0, 1});
        CHECK(engines.made[0]->spec.what == "job j group 'dp'");
        CHECK(engines.made[0]->spec.reuse_key.empty());  // no owner given: nothing is kept
        REQUIRE(run_across(f, executor, engines, OpKind::kAllreduce, args).ok());
        // The narrow half path rounds after every combine on the host; NCCL's stage adds in
        // float32 and the sum is rounded once, when divided and written back, so with a
        // post-divide it may differ from the host path in the last bit (README). Every client
        // still gets the same bits.
        const bool exact = args.wide_accumulate || args.scale != reduce::Scale::kAfter ||
                           (dtype != DType::kFloat16 && dtype != DType::kBFloat16);
        for (size_t t = 0; t < f.set->layout.size(); ++t) {
          const Bytes want = exact ? f.reduced(args, t) : f.tensor(0, t);
          for (int c = 0; c < kClients; ++c) {
            INFO("client " << c << " tensor " << t);
            CHECK(reduce::cases::first_difference(f.tensor(c, t), want, dtype_size(dtype)) == "");
          }
        }
        // One engine call and one done event record per GPU per bucket; no host waits.
        CHECK(engines.made[0]->calls.size() == f.set->plan.buckets.size());
        CHECK(f.api.records == 2 * static_cast<int>(f.set->plan.buckets.size()));
        CHECK(f.api.synchronizations == 0);
      }
      CHECK(f.api.allocations.empty());
      CHECK(f.api.streams == 0);
      CHECK(f.api.events == 0);
    }
  }
}

TEST_CASE("cuda executor: reduce and broadcast across GPUs reach the right root", "[cuda][executor][nccl]") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    Fixture f(dtype, {0, 0, 1});
    HostDeviceEngines engines;
    CudaExecutor executor(options_for(f, &engines));
    LocalRendezvous local;
    REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
    const reduce::KernelArgs sum{.dtype = dtype};
    REQUIRE(run_across(f, executor, engines, OpKind::kReduce, sum, 2).ok());  // the root is on GPU 1 (rank 1)
    CHECK(engines.made[0]->calls.back() == "reduce to 1");
    for (size_t t = 0; t < f.set->layout.size(); ++t) {
      CHECK(reduce::cases::first_difference(f.tensor(2, t), f.reduced(sum, t), dtype_size(dtype)) == "");
      CHECK(f.tensor(0, t) == f.original_tensor(0, t));
      CHECK(f.tensor(1, t) == f.original_tensor(1, t));
    }
    for (int root : {1, 2}) {
      for (int c = 0; c < kClients; ++c) {
        std::copy(f.original[static_cast<size_t>(c)].begin(), f.original[static_cast<size_t>(c)].end(),
                  f.memory[static_cast<size_t>(c)].begin());
      }
      REQUIRE(run_across(f, executor, engines, OpKind::kBroadcast, sum, root).ok());
      CHECK(engines.made[0]->calls.back() == "broadcast from " + std::to_string(root == 2 ? 1 : 0));
      for (size_t t = 0; t < f.set->layout.size(); ++t) {
        for (int c = 0; c < kClients; ++c) CHECK(f.tensor(c, t) == f.original_tensor(root, t));
      }
    }
  }
}

TEST_CASE("cuda executor: a failing device engine fails the bucket, drained and named", "[cuda][executor][nccl]") {
  Fixture f(DType::kFloat32, {0, 1, 1});
  HostDeviceEngines engines;
  engines.fail_calls = Status::peer_lost("ncclAllReduce failed: remote process exited");
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
  const Status failed = run_across(f, executor, engines, OpKind::kAllreduce, reduce::KernelArgs{});
  CHECK(failed.code() == ErrorCode::kPeerLost);
  CHECK_THAT(failed.message(), Catch::StartsWith("allreduce bucket 0 of set 0: ncclAllReduce failed"));
  CHECK(f.api.synchronizations == 2);  // both GPUs' streams drained before the answer
  CHECK(f.kernels.scatters == 0);      // nothing written back
  // The engine was aborted by the failing bucket itself, so peers fail fast.
  CHECK(engines.made[0]->aborted.code() == ErrorCode::kPeerLost);
}

TEST_CASE("cuda executor: a bucket the watchdog fails is drained before its error is answered",
          "[cuda][executor][nccl]") {
  Fixture f(DType::kFloat32, {0, 1, 1});
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
  BucketCall call = f.call(OpKind::kAllreduce, 1);
  std::optional<Status> answer;
  executor.launch(call, [&](const Status& s) { answer = s; });
  REQUIRE_FALSE(answer.has_value());  // queued on both GPUs, watched
  CHECK(f.api.synchronizations == 0);
  // The watchdog's verdict: a timeout, after it aborted the communicators.
  engines.made[0]->abort(Status::timeout("NCCL job j set 0 group 'dp': allreduce bucket 0 of set 0 did not finish"));
  REQUIRE(engines.made[0]->finish());
  REQUIRE(answer.has_value());
  CHECK(answer->code() == ErrorCode::kTimeout);
  CHECK(f.api.synchronizations == 2);  // both GPUs' streams drained before the answer
  // The executor's abort reaches the engine, and later buckets fail with it.
  executor.abort(Status::aborted("job j failed"));
  answer.reset();
  executor.launch(call, [&](const Status& s) { answer = s; });
  REQUIRE(answer.has_value());
  CHECK(answer->message() == "job j failed");
}

TEST_CASE("cuda executor: a client whose tensors of one set sit on two GPUs is refused", "[cuda][executor][nccl]") {
  Fixture f(DType::kFloat32, {0, 0, 1});
  // Point one tensor of client 0 into client 2's region (GPU 1).
  auto set = std::make_shared<TensorSet>(*f.set);
  set->address[0][0] = f.memory[2].data();
  f.set = set;
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  const Status refused = executor.admit(*f.set, SetAdmission{"j", &local, &f.topology});
  CHECK(refused.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(refused.message(), Catch::Contains("local rank 0 has tensors on GPUs"));
}

TEST_CASE("cuda executor: device order through the clients' event rings, answered at enqueue",
          "[cuda][executor][events]") {
  Fixture f(DType::kFloat32);
  std::vector<std::string> trace;
  f.api.trace = &trace;
  f.kernels.trace = &trace;
  // Every client's rings, as the backend factory makes them at registration, named in the
  // trace by direction, client and slot ("r0.1": client 0's ready event of slot 1).
  auto set = std::make_shared<TensorSet>(*f.set);
  for (int c = 0; c < kClients; ++c) {
    std::unique_ptr<EventRing> rings[2];
    for (int direction = 0; direction < 2; ++direction) {
      f.api.name_prefix = (direction == 0 ? "r" : "d") + std::to_string(c);
      REQUIRE(EventRing::create(&f.api, 0, &rings[direction]).ok());
      CHECK(rings[direction]->handles().size() == kEventsPerDirection);
    }
    set->events.push_back(std::make_shared<ClientEventRings>(0, std::move(rings[0]), std::move(rings[1])));
  }
  f.set = set;
  {
    CudaExecutor executor(options_for(f, nullptr));
    const reduce::KernelArgs sum{};
    REQUIRE(f.run(executor, OpKind::kAllreduce, sum).ok());  // operation seq 1: slot 1
    for (size_t t = 0; t < f.set->layout.size(); ++t) {
      for (int c = 0; c < kClients; ++c) CHECK(f.tensor(c, t) == f.reduced(sum, t));
    }
    // Per bucket: the host sees each client's ready record through (no stream waits on a
    // client's event), then the kernels, then the done records, then the executor's own event
    // that tracks the queued bucket; no host synchronisation before the answers.
    const std::vector<std::string> bucket = {"query r0.1",  "query r1.1",  "query r2.1",  "gather", "scatter",
                                             "record d0.1", "record d1.1", "record d2.1", "record own"};
    std::vector<std::string> want;
    for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) want.insert(want.end(), bucket.begin(), bucket.end());
    CHECK(trace == want);
    CHECK(f.api.synchronizations == 0);
    // A failing job drains the stream before the clients hear of it.
    CHECK(executor.quiesce(std::chrono::steady_clock::now() + std::chrono::seconds(1)));
    CHECK(f.api.synchronizations == 0);
    // Operation 65 reuses slot 1.
    trace.clear();
    BucketCall call = f.call(OpKind::kAllreduce, 65);
    Status answer = Status::internal("not answered");
    executor.launch(call, [&](const Status& s) { answer = s; });
    REQUIRE(answer.ok());
    CHECK(trace.front() == "query r0.1");  // slot 1 again
    CHECK(trace[trace.size() - 2] == "record d2.1");
  }
  f.set.reset();
  set.reset();
  CHECK(f.api.events == 0);  // every event destroyed with its ring
}

TEST_CASE("cuda executor: allgather on one GPU and across two puts every rank's bytes in every output",
          "[cuda][executor][allgather]") {
  for (const std::vector<int>& gpus : {std::vector<int>{0, 0, 0}, std::vector<int>{0, 1, 1}}) {
    INFO("GPUs of the clients: " << gpus[0] << gpus[1] << gpus[2]);
    for (DType dtype : {DType::kFloat16, DType::kFloat32, DType::kInt64}) {
      Fixture f(dtype, gpus, /*with_gather=*/true);
      HostDeviceEngines engines;
      CudaExecutor executor(options_for(f, &engines));
      LocalRendezvous local;
      REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
      const bool across = gpus[1] != gpus[0];
      REQUIRE(engines.made.size() == (across ? 1u : 0u));
      if (across) {
        REQUIRE(run_across(f, executor, engines, OpKind::kAllgather, reduce::KernelArgs{.dtype = dtype}).ok());
        // One broadcast per source rank per bucket, rooted at the source's GPU.
        CHECK(engines.made[0]->calls.size() == kClients * f.set->plan.buckets.size());
        CHECK(engines.made[0]->calls[0] == "broadcast from 0");
        CHECK(engines.made[0]->calls[1] == "broadcast from 1");
        CHECK(engines.made[0]->calls[2] == "broadcast from 1");
      } else {
        REQUIRE(f.run(executor, OpKind::kAllgather, reduce::KernelArgs{.dtype = dtype}).ok());
      }
      for (int c = 0; c < kClients; ++c) {
        for (int rank = 0; rank < kClients; ++rank) {
          for (size_t t = 0; t < f.set->layout.size(); ++t) {
            INFO("output of client " << c << ", rank " << rank << ", tensor " << t);
            CHECK(f.gathered_tensor(c, rank, t) == f.original_tensor(rank, t));
          }
        }
        for (size_t t = 0; t < f.set->layout.size(); ++t) CHECK(f.tensor(c, t) == f.original_tensor(c, t));  // inputs kept
      }
    }
  }
}

TEST_CASE("cuda executor: one flat client per GPU is reduced in place, zero-copy", "[cuda][executor][nccl]") {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBFloat16}) {
    for (const reduce::KernelArgs& args : reduce::cases::valid_args(dtype)) {
      INFO(reduce::cases::describe(args));
      Fixture f(dtype, {0, 1, 2}, /*with_gather=*/false, /*flat=*/true);
      for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) REQUIRE(f.set->canonical_run[b]);
      HostDeviceEngines engines;
      CudaExecutor executor(options_for(f, &engines));
      LocalRendezvous local;
      REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
      REQUIRE(run_across(f, executor, engines, OpKind::kAllreduce, args).ok());
      // (The narrow half path across GPUs may differ in the last bit: NCCL's float32 sums skip
      // the per-step rounding between GPUs.)
      const bool exact = args.wide_accumulate || dtype != DType::kBFloat16;
      for (size_t t = 0; t < f.set->layout.size(); ++t) {
        const Bytes want = exact ? f.reduced(args, t) : f.tensor(0, t);
        for (int c = 0; c < kClients; ++c) {
          INFO("client " << c << " tensor " << t);
          CHECK(reduce::cases::first_difference(f.tensor(c, t), want, dtype_size(dtype)) == "");
        }
      }
      const int buckets = static_cast<int>(f.set->plan.buckets.size());
      if (dtype == DType::kBFloat16) {
        // Half types accumulate in float32: through the bucket buffers as usual.
        CHECK(f.kernels.gathers == 3 * buckets);
      } else {
        // No copies: kernels only where an avg divides, in place, before or after NCCL.
        CHECK(f.kernels.gathers == (args.scale == reduce::Scale::kBefore ? 3 * buckets : 0));
        CHECK(f.kernels.scatters == (args.scale == reduce::Scale::kAfter ? 3 * buckets : 0));
      }
    }
  }
}


TEST_CASE("cuda executor: a client's ready event that never fires is named within the execution bound, with "
          "nothing queued behind it, and a lost drain frees nothing",
          "[cuda][executor][events]") {
  Fixture f(DType::kFloat32);
  add_event_rings(f);
  CudaExecutor executor(options_for(f, nullptr));
  LocalRendezvous local;
  SetAdmission admission{"j", &local, &f.topology};
  admission.execution_timeout = std::chrono::milliseconds(100);
  REQUIRE(executor.admit(*f.set, admission).ok());
  // The GPU never gets through anything (a ready event that never fires).
  f.api.events_pending = true;
  BucketCall call = f.call(OpKind::kAllreduce, 0);
  Status failed;
  const auto started = std::chrono::steady_clock::now();
  for (uint64_t seq = 1; seq <= 20 && failed.ok(); ++seq) {
    call.seq = seq;
    executor.launch(call, [&](const Status& s) { failed = s; });
  }
  // The first bucket polls the clients' ready events from the host before it queues anything
  // (a stream wait on them could never be cancelled), and gives up at the execution bound.
  CHECK(failed.code() == ErrorCode::kTimeout);
  CHECK(failed.message() == "bucket 0 of set 0 on GPU 0: local rank 0 announced its tensors of operation 1 ready, but "
                            "the work before that on its stream did not finish within 100 ms (the execution bound)");
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(2));
  CHECK(f.kernels.gathers == 0);  // nothing was queued behind the event
  // The job fails; the drain gives up at its deadline, and from then on nothing is freed.
  const size_t allocated = f.api.allocations.size();
  CHECK_FALSE(executor.quiesce(std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  CHECK_FALSE(executor.quiesce(std::chrono::steady_clock::now() + std::chrono::seconds(5)));  // at once: lost
  CHECK(allocated > 0);
  CHECK(f.api.allocations.size() == allocated);
  CHECK(f.api.stuck_synchronizations == 0);  // nothing waited on the stuck stream without a bound
}

TEST_CASE("cuda executor: a multi-GPU bucket stuck on a client is answered without waiting on the GPU, and its "
          "engine is abandoned, not freed, when the drain is lost",
          "[cuda][executor][events][nccl]") {
  Fixture f(DType::kFloat32, {0, 0, 1});
  add_event_rings(f);
  HostDeviceEngines engines;
  engines.fail_calls = Status::peer_lost("ncclAllReduce failed: remote process exited");
  std::shared_ptr<bool> abandoned;
  {
    CudaExecutor executor(options_for(f, &engines));
    LocalRendezvous local;
    SetAdmission admission{"j", &local, &f.topology};
    admission.execution_timeout = std::chrono::milliseconds(50);
    REQUIRE(executor.admit(*f.set, admission).ok());
    abandoned = engines.made[0]->abandoned;
    f.api.events_pending = true;  // the GPU is stuck on a client's ready event
    BucketCall call = f.call(OpKind::kAllreduce, 1);
    std::optional<Status> answer;
    executor.launch(call, [&](const Status& s) { answer = s; });
    REQUIRE(answer.has_value());
    CHECK(answer->code() == ErrorCode::kTimeout);  // the ready events, polled from the host
    CHECK(engines.made[0]->calls.empty());         // no collective was queued behind them
    CHECK(engines.made[0]->aborted.code() == ErrorCode::kTimeout);  // peers fail fast
    CHECK(f.api.stuck_synchronizations == 0);  // answered without a synchronisation that would hang
    CHECK_FALSE(executor.quiesce(std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  }
  CHECK(*abandoned);  // leaked with its communicators, never aborted under the GPU's work
}

TEST_CASE("cuda executor: after a lost drain the destructor frees nothing", "[cuda][executor][events]") {
  Fixture f(DType::kFloat32);
  add_event_rings(f);
  {
    CudaExecutor executor(options_for(f, nullptr));
    REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
    f.api.events_pending = true;
    REQUIRE_FALSE(executor.quiesce(std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  }
  CHECK_FALSE(f.api.allocations.empty());  // tables and bucket buffer kept: the GPU may still use them
  CHECK(f.api.streams > 0);
}

}  // namespace gradsync::cuda

namespace gradsync::cuda {

// What a communicator may be kept under (nccl/park.h): the owner and job, and the engine's name
// (the group and the set that made it; the engine adds its GPUs and slots); the same in every
// generation of the job, another for another user's job of that id.
TEST_CASE("cuda executor: the key a communicator is kept under names the user, the job, the group and the set "
          "that made it",
          "[cuda][executor][nccl][rejoin]") {
  const auto key_for = [](const std::string& owner_job) {
    Fixture f(DType::kFloat32, {0, 0, 1});
    HostDeviceEngines engines;
    CudaExecutor executor(options_for(f, &engines));
    LocalRendezvous local;
    SetAdmission admission{"resnet", &local, &f.topology};
    admission.owner_job = owner_job;
    REQUIRE(executor.admit(*f.set, admission).ok());
    REQUIRE(engines.made.size() == 1);
    return engines.made[0]->spec.reuse_key;
  };
  const std::string mine = key_for("1000.resnet");
  CHECK(mine == "11:1000.resnet/12:nccl/s0/2:dp");
  CHECK(key_for("1000.resnet") == mine);            // the job's next generation
  CHECK(key_for("1001.resnet") != mine);            // another user's job of the same id
  CHECK(key_for("1000.resnet/12:nccl/s0") != mine);  // names cannot run into each other
}

TEST_CASE("cuda executor: a DDP job's 25 sets on the same GPUs share one NCCL communicator",
          "[cuda][executor][nccl]") {
  // DDP's comm hook registers one set per DDP bucket (about 25 for ResNet-50); each used to get
  // its own communicator per GPU.
  Fixture f(DType::kFloat32, {0, 0, 1});
  add_event_rings(f);
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  SetAdmission admission{"ddp", &local, &f.topology};
  admission.owner_job = "1000.ddp";
  std::vector<std::shared_ptr<TensorSet>> sets;
  for (uint32_t id = 0; id < 25; ++id) {
    auto set = std::make_shared<TensorSet>(*f.set);
    set->id = id;
    sets.push_back(set);
    REQUIRE(executor.admit(*set, admission).ok());
  }
  CHECK(engines.made.size() == 1);  // one communicator for both GPUs of the group, not 25
  // Buckets of any set go through it.
  for (uint32_t id : {0u, 7u, 24u}) {
    BucketCall call = f.call(OpKind::kAllreduce, 1);
    call.set = sets[id];
    std::optional<Status> answer;
    executor.launch(call, [&](const Status& s) { answer = s; });
    REQUIRE(answer.has_value());
    CHECK(answer->ok());
  }
  CHECK(engines.made[0]->calls.size() == 3);
  // A set whose clients sit otherwise on those GPUs (another layout) gets its own, split off
  // the first: it holds every GPU of the new one.
  Fixture other(DType::kFloat32, {1, 1, 0});
  auto moved = std::make_shared<TensorSet>(*other.set);
  moved->id = 25;
  REQUIRE(executor.admit(*moved, admission).ok());
  REQUIRE(engines.made.size() == 2);
  CHECK(engines.made[1]->spec.parent == engines.made[0]);
  // One on a GPU no engine holds is made fresh.
  Fixture third(DType::kFloat32, {0, 2, 2});
  auto elsewhere = std::make_shared<TensorSet>(*third.set);
  elsewhere->id = 26;
  REQUIRE(executor.admit(*elsewhere, admission).ok());
  REQUIRE(engines.made.size() == 3);
  CHECK(engines.made[2]->spec.parent == nullptr);
}

TEST_CASE("cuda executor: a VMM region's NCCL registration is undone once no set uses it and the GPU is through, "
          "without waiting, and the region is let go",
          "[cuda][executor][nccl]") {
  // What lets a client free device memory before it leaves (a staging area of a released set):
  // the registration kept the region mapped, and must be undone before the memory is unmapped,
  // but not while a queued bucket may still use it. The worker must not wait for that: a peer
  // node may be waiting on it (a registration's exchange).
  Fixture f(DType::kFloat32, {0, 0, 1});
  add_event_rings(f);  // answered at enqueue: a released set's buckets may still be on the GPU
  HostDeviceEngines engines;
  engines.take_registrations = true;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  SetAdmission admission{"j", &local, &f.topology};
  auto first = std::make_shared<TensorSet>(*f.set);
  auto second = std::make_shared<TensorSet>(*f.set);  // the same memory, as a pooled staging area
  first->id = 0;
  second->id = 1;
  REQUIRE(executor.admit(*first, admission).ok());
  REQUIRE(executor.admit(*second, admission).ok());
  REQUIRE(engines.made.size() == 1);
  HostDeviceEngine& engine = *engines.made[0];
  CHECK(engine.registrations.size() == 3);  // each client's region once, not once per set
  std::vector<std::weak_ptr<const MemoryRegion>> regions(f.set->regions.begin(), f.set->regions.end());
  std::vector<bool> gpu_busy_at_deregistration;
  engine.on_deregister = [&] { gpu_busy_at_deregistration.push_back(f.api.events_pending.load()); };

  // A bucket of the first set, queued on the GPUs and not through yet.
  BucketCall call = f.call(OpKind::kAllreduce, 1);
  call.set = first;
  std::optional<Status> answer;
  executor.launch(call, [&](const Status& s) { answer = s; });
  REQUIRE(answer.has_value());
  REQUIRE(answer->ok());
  f.api.events_pending = true;
  executor.retire_set(0);  // the second still uses every region: nothing is undone
  CHECK(engine.deregistrations.empty());
  // The last user goes while the first's bucket is still on the GPU: nothing is undone yet,
  // and the retirement returns at once.
  executor.retire_set(1);
  CHECK(engine.deregistrations.empty());
  // Once the GPUs are through (across GPUs the engine's watchdog answers the bucket), the next
  // launch or retirement undoes them.
  f.api.events_pending = false;
  while (engine.finish()) {
  }
  executor.tidy();  // what the worker calls before it sleeps: an idle job frees too
  auto sorted = [](std::vector<std::pair<int, void*>> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  CHECK(sorted(engine.deregistrations) == sorted(engine.registrations));
  CHECK(gpu_busy_at_deregistration == std::vector<bool>(3, false));
  // Nothing of the executor's holds the regions now.
  first.reset();
  second.reset();
  call.set.reset();
  f.set.reset();
  for (const auto& region : regions) CHECK(region.expired());
}

TEST_CASE("cuda executor: what NCCL did not take is forgotten at once, and a released region in use again stays "
          "registered",
          "[cuda][executor][nccl]") {
  Fixture f(DType::kFloat32, {0, 0, 1});
  add_event_rings(f);
  HostDeviceEngines engines;  // NCCL registers nothing (NCCL_LOCAL_REGISTER=0)
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  SetAdmission admission{"j", &local, &f.topology};
  auto first = std::make_shared<TensorSet>(*f.set);
  first->id = 0;
  REQUIRE(executor.admit(*first, admission).ok());
  HostDeviceEngine& engine = *engines.made.at(0);
  BucketCall call = f.call(OpKind::kAllreduce, 1);
  call.set = first;
  std::optional<Status> answer;
  executor.launch(call, [&](const Status& s) { answer = s; });
  REQUIRE(answer.has_value());
  f.api.events_pending = true;
  executor.retire_set(0);  // on the GPU still, but nothing of NCCL's holds the memory
  CHECK(engine.deregistrations.size() == 3);
  f.api.events_pending = false;
  while (engine.finish()) {
  }
  // Taken by NCCL, released, then used by a new set before the GPU passed the fence: the
  // registration stays, and is not made twice.
  engine.take_registrations = true;
  auto again = std::make_shared<TensorSet>(*f.set);
  again->id = 1;
  REQUIRE(executor.admit(*again, admission).ok());
  CHECK(engine.registrations.size() == 6);
  auto third = std::make_shared<TensorSet>(*f.set);
  third->id = 2;
  REQUIRE(executor.admit(*third, admission).ok());
  executor.retire_set(1);
  call.set = third;
  answer.reset();
  executor.launch(call, [&](const Status& s) { answer = s; });
  f.api.events_pending = true;
  executor.retire_set(2);  // fenced behind the bucket just launched
  auto fourth = std::make_shared<TensorSet>(*f.set);
  fourth->id = 3;
  REQUIRE(executor.admit(*fourth, admission).ok());  // in use again before the fence passed
  f.api.events_pending = false;
  while (engine.finish()) {
  }
  executor.retire_set(9);
  CHECK(engine.registrations.size() == 6);    // not registered again
  CHECK(engine.deregistrations.size() == 3);  // and not undone under the fourth
}

TEST_CASE("cuda executor: a registration NCCL would not undo keeps its region mapped, and later sets register anew",
          "[cuda][executor][nccl]") {
  Fixture f(DType::kFloat32, {0, 0, 1});
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  SetAdmission admission{"j", &local, &f.topology};
  REQUIRE(executor.admit(*f.set, admission).ok());
  HostDeviceEngine& engine = *engines.made.at(0);
  std::vector<std::weak_ptr<const MemoryRegion>> regions(f.set->regions.begin(), f.set->regions.end());
  // Offered again when a new set uses the memory after the registration was undone.
  executor.retire_set(f.set->id);
  CHECK(engine.deregistrations.size() == 3);
  auto again = std::make_shared<TensorSet>(*f.set);
  again->id = 5;
  REQUIRE(executor.admit(*again, admission).ok());
  CHECK(engine.registrations.size() == 6);
  // Refused: the region stays held by the executor, so nothing else can be mapped at its address.
  engine.fail_deregister = Status::internal("ncclCommDeregister failed (fake)");
  executor.retire_set(5);
  CHECK(engine.deregistrations.size() == 3);
  again.reset();
  f.set.reset();
  for (const auto& region : regions) CHECK_FALSE(region.expired());
  // Tried again, not at once (a refusal at every launch would flood the log) but after 2 s;
  // undone, the regions go.
  engine.fail_deregister = Status();
  executor.tidy();
  CHECK(engine.deregistrations.size() == 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  executor.tidy();
  CHECK(engine.deregistrations.size() == 6);
  for (const auto& region : regions) CHECK(region.expired());
}

TEST_CASE("cuda executor: a group is split off the job's 'dp' communicator, which is made first",
          "[cuda][executor][nccl]") {
  // Tensors 3 and 4 of the fixture's set in group 'a' of local ranks 0 and 1 (GPUs 0 and 1),
  // which sorts before 'dp'.
  Fixture f(DType::kFloat32, {0, 1, 2});
  Topology topology;
  REQUIRE(make_topology(kClients, kClients, 0, 0, {{"a", {0, 1}}}, &topology).ok());
  auto set = std::make_shared<TensorSet>(*f.set);
  set->layout[3].group = "a";
  set->layout[4].group = "a";
  complete_tensor_set(set.get(), topology);
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  LocalRendezvous local;
  SetAdmission admission{"j", &local, &topology};
  REQUIRE(executor.admit(*set, admission).ok());
  REQUIRE(engines.made.size() == 2);
  CHECK(engines.made[0]->spec.name == "nccl/s0/2:dp");
  CHECK(engines.made[0]->spec.parent == nullptr);
  CHECK(engines.made[1]->spec.name == "nccl/s0/1:a");
  CHECK(engines.made[1]->spec.parent == engines.made[0]);
  // An engine that cannot be split (not connected, failed, or not NCCL's) is no parent.
  HostDeviceEngines others;
  CudaExecutor second(options_for(f, &others));
  auto again = std::make_shared<TensorSet>(*set);
  REQUIRE(second.admit(*f.set, admission).ok());
  others.made[0]->can_split = false;
  again->id = 1;
  REQUIRE(second.admit(*again, admission).ok());
  REQUIRE(others.made.size() == 2);
  CHECK(others.made[1]->spec.parent == nullptr);
}

namespace {

// Node 0 of a two-node job whose node 1 offers what the test says in every exchange whose name
// ends with "/share", and echoes node 0's offer in any other.
class TwoNodes final : public Rendezvous {
 public:
  int node() const override { return 0; }
  int nodes() const override { return 2; }
  Status exchange(const std::string& name, const std::string& mine, std::vector<std::string>* all) override {
    names.push_back(name);
    const bool share = name.size() >= 6 && name.compare(name.size() - 6, 6, "/share") == 0;
    *all = {mine, share ? node1_offers : mine};
    return Status();
  }
  std::string node1_offers = ";-";  // nothing to share, no parent
  std::vector<std::string> names;
};

}  // namespace

TEST_CASE("cuda executor: across nodes a communicator is shared only when every node offers the same one",
          "[cuda][executor][nccl]") {
  Fixture f(DType::kFloat32, {0, 0, 1});
  HostDeviceEngines engines;
  CudaExecutor executor(options_for(f, &engines));
  TwoNodes nodes;
  SetAdmission admission{"j", &nodes, &f.topology};
  REQUIRE(executor.admit(*f.set, admission).ok());
  REQUIRE(engines.made.size() == 1);
  const std::string first = engines.made[0]->spec.name;
  CHECK(first == "nccl/s0/2:dp");
  // Node 1 shares it too: so does this node.
  auto second = std::make_shared<TensorSet>(*f.set);
  second->id = 1;
  nodes.node1_offers = first + ";" + first;
  REQUIRE(executor.admit(*second, admission).ok());
  CHECK(engines.made.size() == 1);
  CHECK(nodes.names.back() == "nccl/s1/2:dp/share");
  // Node 1's GPUs of the group changed (it offers none to share, and no parent): everybody
  // makes a fresh one.
  auto third = std::make_shared<TensorSet>(*f.set);
  third->id = 2;
  nodes.node1_offers = ";-";
  REQUIRE(executor.admit(*third, admission).ok());
  REQUIRE(engines.made.size() == 2);
  CHECK(engines.made[1]->spec.name == "nccl/s2/2:dp");
  CHECK(engines.made[1]->spec.parent == nullptr);
  // Node 1 could split only the second engine (it keeps the first in another executor, say of
  // another memory kind) and has nothing to share: everybody splits the second, by name.
  auto fourth = std::make_shared<TensorSet>(*f.set);
  fourth->id = 3;
  nodes.node1_offers = "nccl/s2/2:dp nccl/s9/2:dp;-";
  REQUIRE(executor.admit(*fourth, admission).ok());
  REQUIRE(engines.made.size() == 3);
  CHECK(engines.made[2]->spec.parent == engines.made[1]);
  // Node 1 lists engines this node does not have, and both of its: node 0's order decides.
  auto fifth = std::make_shared<TensorSet>(*f.set);
  fifth->id = 4;
  nodes.node1_offers = "nccl/s7/2:dp nccl/s2/2:dp nccl/s0/2:dp;-";
  REQUIRE(executor.admit(*fifth, admission).ok());
  REQUIRE(engines.made.size() == 4);
  CHECK(engines.made[3]->spec.parent == engines.made[0]);
  // None in common: fresh.
  auto sixth = std::make_shared<TensorSet>(*f.set);
  sixth->id = 5;
  nodes.node1_offers = "nccl/s7/2:dp;-";
  REQUIRE(executor.admit(*sixth, admission).ok());
  REQUIRE(engines.made.size() == 5);
  CHECK(engines.made[4]->spec.parent == nullptr);
  // A node that offers garbage is named.
  auto seventh = std::make_shared<TensorSet>(*f.set);
  seventh->id = 6;
  for (const std::string garbage : {"", "nccl/s0/2:dp", "x;", "x;a b", "x;a;b"}) {
    nodes.node1_offers = garbage;
    const Status refused = executor.admit(*seventh, admission);
    CHECK(refused.code() == ErrorCode::kProtocol);
    CHECK_THAT(refused.message(), Catch::Contains("node 1 offered an undecodable communicator to share"));
  }
}

}  // namespace gradsync::cuda

namespace gradsync::cuda {

namespace {

// Each client's shard of the fixture's set equals the host reduction's, cut as shared/shard.h
// says, and the inputs are as they were.
void check_shards(const Fixture& f, const reduce::KernelArgs& args) {
  const Bytes flat = f.reduced_flat(args);
  const size_t element = dtype_size(f.dtype);
  const uint64_t elements = flat.size() / element;
  for (int c = 0; c < kClients; ++c) {
    const ShardRange shard = shard_of(elements, kClients, static_cast<uint64_t>(c));
    const Bytes want(flat.begin() + static_cast<std::ptrdiff_t>(shard.first * element),
                     flat.begin() + static_cast<std::ptrdiff_t>((shard.first + shard.count) * element));
    const Bytes got(f.shards[static_cast<size_t>(c)].begin(),
                    f.shards[static_cast<size_t>(c)].begin() + static_cast<std::ptrdiff_t>(want.size()));
    INFO("shard of client " << c);
    CHECK(reduce::cases::first_difference(got, want, element) == "");
    // Past a shorter shard, its output keeps the marker.
    for (size_t i = want.size(); i < f.shards[static_cast<size_t>(c)].size(); ++i) {
      CHECK(f.shards[static_cast<size_t>(c)][i] == std::byte{0x5a});
    }
    for (size_t t = 0; t < f.set->layout.size(); ++t) CHECK(f.tensor(c, t) == f.original_tensor(c, t));
  }
}

}  // namespace

TEST_CASE("cuda executor: reduce_scatter on one GPU puts each client's shard of the reduction in its output",
          "[cuda][executor][reduce_scatter]") {
  for (DType dtype : reduce::cases::kAllDTypes) {
    for (const reduce::KernelArgs& args : reduce::cases::valid_args(dtype)) {
      INFO(reduce::cases::describe(args));
      // Buckets of 8192 elements: the shards (4550 elements) are cut by buckets and tensors.
      Fixture f(dtype, {0, 0, 0}, /*with_gather=*/false, /*flat=*/false, /*with_shards=*/true);
      REQUIRE(f.set->plan.buckets.size() >= 2);
      {
        CudaExecutor executor(options_for(f, nullptr));
        REQUIRE(f.run(executor, OpKind::kReduceScatter, args).ok());
        check_shards(f, args);
        // One gather and one scatter (every client's pieces in one table) per bucket.
        CHECK(f.kernels.gathers == static_cast<int>(f.set->plan.buckets.size()));
        CHECK(f.kernels.scatters == static_cast<int>(f.set->plan.buckets.size()));
      }
      CHECK(f.api.allocations.empty());
    }
  }
}

TEST_CASE("cuda executor: reduce_scatter across GPUs is NCCL's reduce-scatter when the bucket is the set and each "
          "rank has its GPU, else an allreduce",
          "[cuda][executor][reduce_scatter][nccl]") {
  struct Layout {
    std::vector<int> gpus;
    std::optional<uint64_t> cap;  // 0: one bucket
    bool native;
  };
  for (const Layout& layout : {Layout{{0, 1, 2}, 0, true}, Layout{{0, 1, 2}, std::nullopt, false},
                               Layout{{0, 0, 1}, 0, false}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32, DType::kUInt8}) {
      for (const reduce::KernelArgs& args : reduce::cases::valid_args(dtype)) {
        // NCCL's float32 sums of half types skip the per-step rounding of the narrow host path.
        if (!args.wide_accumulate && (dtype == DType::kBFloat16 || dtype == DType::kFloat16)) continue;
        INFO("GPUs " << layout.gpus[0] << layout.gpus[1] << layout.gpus[2] << ", " << reduce::cases::describe(args));
        Fixture f(dtype, layout.gpus, false, false, true, layout.cap);
        HostDeviceEngines engines;
        CudaExecutor executor(options_for(f, &engines));
        LocalRendezvous local;
        REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
        REQUIRE(engines.made.size() == 1);
        REQUIRE(run_across(f, executor, engines, OpKind::kReduceScatter, args).ok());
        check_shards(f, args);
        const auto& calls = engines.made[0]->calls;
        REQUIRE(calls.size() == f.set->plan.buckets.size());
        const std::string want = layout.native ? "reduce_scatter of " + std::to_string(f.set->shard_capacity) : "allreduce";
        for (const std::string& call : calls) CHECK(call == want);
      }
    }
  }
}

}  // namespace gradsync::cuda

namespace gradsync::cuda {

// Wire compression on device sets (ReduceOptions::wire_dtype): where the group spans nodes,
// each GPU's float32 sums are narrowed to the half type, NCCL carries and combines that type,
// and the result is widened back before the scatter; within one node nothing changes. A
// float16 or bfloat16 set is gathered into float32 like any other, so it takes the same path
// (and then crosses at its own size); its result is rounded into its dtype at the scatter.
TEST_CASE("cuda executor: wire compression narrows the sums around NCCL across nodes, not within one",
          "[cuda][executor][nccl][wire]") {
  // Element i of a buffer of `dtype` as a float, and a float rounded to `dtype` and back.
  const auto load = [](DType dtype, const Bytes& bytes, uint64_t i) {
    if (dtype == DType::kFloat32) {
      float x = 0;
      std::memcpy(&x, bytes.data() + i * 4, 4);
      return x;
    }
    uint16_t bits = 0;
    std::memcpy(&bits, bytes.data() + i * 2, 2);
    return dtype == DType::kFloat16 ? half_to_float(bits) : bfloat16_to_float(bits);
  };
  const auto round_to = [](DType dtype, float x) {
    if (dtype == DType::kBFloat16) return bfloat16_to_float(float_to_bfloat16(x));
    if (dtype == DType::kFloat16) return half_to_float(float_to_half(x));
    return x;
  };
  for (DType set_dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
   for (DType wire : {DType::kBFloat16, DType::kFloat16}) {
    if (set_dtype != DType::kFloat32 && wire != set_dtype) continue;  // refused by check_op
    for (OpKind kind : {OpKind::kAllreduce, OpKind::kReduce}) {
     for (bool across_nodes : {true, false}) {
      for (const reduce::KernelArgs& args :
           {reduce::KernelArgs{.dtype = set_dtype},
            reduce::KernelArgs{.dtype = set_dtype, .scale = reduce::Scale::kAfter, .divisor = 3}}) {
        INFO(dtype_name(set_dtype) << " set, " << dtype_name(wire) << " wire, "
                                   << (kind == OpKind::kReduce ? "reduce" : "allreduce")
                                   << (across_nodes ? " across nodes" : " on one node") << ", "
                                   << reduce::cases::describe(args));
        Fixture f(set_dtype, {0, 1, 2});
        HostDeviceEngines engines;
        CudaExecutor executor(options_for(f, &engines));
        LocalRendezvous local;
        REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
        // The same local ranks as node 0 of two: the group "dp" now spans nodes.
        if (across_nodes) REQUIRE(make_topology(2 * kClients, kClients, 0, 0, {}, &f.topology).ok());
        for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) {
          BucketCall call = f.call(kind, 1, b, 0);
          call.args = args;
          call.desc.wire = wire;
          std::optional<Status> answer;
          executor.launch(call, [&](const Status& s) { answer = s; });
          if (!answer) REQUIRE(engines.made.front()->finish());
          REQUIRE(answer.has_value());
          REQUIRE(answer->ok());
          if (across_nodes) {
            // NCCL is handed the wire type, whatever the set's: a half set crosses at its size.
            REQUIRE(!engines.made.front()->carried.empty());
            CHECK(engines.made.front()->carried.back() == wire);
          }
        }
        const size_t element = dtype_size(set_dtype);
        size_t inexact = 0;
        for (size_t t = 0; t < f.set->layout.size(); ++t) {
          const Bytes exact = f.reduced(args, t);
          for (int c = 0; c < kClients; ++c) {
            const Bytes got = f.tensor(c, t);
            // A reduce's other ranks keep their tensors.
            if (kind == OpKind::kReduce && c != 0) {
              CHECK(got == f.original_tensor(c, t));
              continue;
            }
            for (uint64_t i = 0; i < f.set->layout[t].numel; ++i) {
              float want = load(set_dtype, exact, i);
              if (across_nodes) {
                // The fake NCCL, as NCCL: each GPU's value in the wire type, combined in rank
                // order, each step rounded to it; then widened, divided and rounded into the
                // set's dtype.
                float sum = 0;
                for (int k = 0; k < kClients; ++k) {
                  const float x = load(set_dtype, f.original_tensor(k, t), i);
                  sum = k == 0 ? round_to(wire, x) : round_to(wire, sum + round_to(wire, x));
                }
                want = round_to(set_dtype, args.scale == reduce::Scale::kAfter ? sum / 3.0f : sum);
              }
              const float have = load(set_dtype, got, i);
              if (std::isnan(want) && std::isnan(have)) continue;
              CHECK(std::memcmp(&have, &want, 4) == 0);
              if (std::memcmp(exact.data() + i * element, got.data() + i * element, element) != 0) ++inexact;
            }
          }
        }
        // Compressed for real across nodes (most float32 sums do not fit the half type; for half
        // sets, a sum of three rounded at every step differs from one rounded once), and not at
        // all within one node.
        if (across_nodes) {
          CHECK(inexact > (set_dtype == DType::kFloat32 ? 300u : 30u));
        } else {
          CHECK(inexact == 0);
        }
      }
     }
    }
   }
  }
}

}  // namespace gradsync::cuda
