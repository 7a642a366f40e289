// The worker driven through its seams: a real Worker with real rings (in memfds, as the daemon
// makes them), the test acting as the clients, and fake executors, engines and clusters
// (fake_backend.h) in place of the host backend, Gloo and the other daemons.
#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "daemon/job/worker.h"
#include "fake_backend.h"

namespace gradsync {
namespace {

using testing::ExecutorLog;
using testing::FakeBackends;
using testing::FakeCluster;
using testing::FakeEngine;
using namespace std::chrono_literals;

Topology topology_of(int nodes, int local) {
  Topology topology;
  REQUIRE(make_topology(nodes * local, local, 0, 0, {}, &topology).ok());
  return topology;
}

// One rank's side of the rings: what a client library does, without the library.
struct TestClient {
  std::shared_ptr<ClientChannel> channel = std::make_shared<ClientChannel>();
  RingWriter<SubmitRing> submit{&channel->client()->submit};
  RingReader<CompletionRing> completions{&channel->daemon()->completion, &channel->client()->completion_cursor};
  uint64_t next_seq = 1;

  bool consumed() const {
    const SubmitRing& ring = channel->client()->submit;
    return ring.cursor.head.load() == ring.data.tail.load();
  }
};

// Three float32 tensors, each in a bucket of its own. The planner visits tensors in reverse, so
// bucket 0 holds tensor 2, bucket 1 tensor 1 and bucket 2 tensor 0.
constexpr uint64_t kNumel = 1024;

struct Harness {
  Harness(int nodes, int local, std::unique_ptr<Cluster> cluster = nullptr,
          std::chrono::milliseconds timeout = 10'000ms, std::chrono::milliseconds execution = 10'000ms)
      : executors(std::make_shared<ExecutorLog>()), backends(executors), clients(static_cast<size_t>(local)) {
    WorkerOptions options;
    options.job_id = "worker-test";
    options.topology = topology_of(nodes, local);
    options.cluster = std::move(cluster);
    options.timeout = timeout;
    options.execution_timeout = execution;
    options.doorbell = doorbell;
    options.backends = &backends;
    options.pool = &pool;
    options.log = Logger(LogLevel::kError);
    topology = options.topology;
    worker = std::make_unique<Worker>(std::move(options));

    auto set = std::make_shared<TensorSet>();
    set->id = 0;
    set->bucket_cap = kNumel * sizeof(float);
    for (int t = 0; t < 3; ++t) set->layout.push_back(plan::TensorLayout{DType::kFloat32, kNumel, kDefaultGroup});
    memory.resize(static_cast<size_t>(local));
    for (auto& client_memory : memory) {
      client_memory.assign(3 * kNumel, 0.0f);
      std::vector<std::byte*> addresses;
      for (int t = 0; t < 3; ++t) addresses.push_back(reinterpret_cast<std::byte*>(client_memory.data() + t * kNumel));
      set->address.push_back(addresses);
    }
    complete_tensor_set(set.get(), topology);
    REQUIRE(set->plan.buckets.size() == 3);
    REQUIRE(set->plan.bucket_of_tensor == std::vector<uint32_t>{2, 1, 0});
    admitted_set = set;

    auto admitted = std::make_shared<std::promise<Status>>();
    std::future<Status> answer = admitted->get_future();
    worker->admit_set(set, [admitted](const Status& status) { admitted->set_value(status); });
    REQUIRE(answer.wait_for(5s) == std::future_status::ready);
    REQUIRE(answer.get().ok());
    for (size_t c = 0; c < clients.size(); ++c) worker->attach_client(static_cast<uint32_t>(c), clients[c].channel);
  }

  ~Harness() { worker->stop(Status::aborted("test over")); }

  void push(int local_rank, const SubmitEntry& entry) {
    REQUIRE(clients[static_cast<size_t>(local_rank)].submit.try_push(entry));
    doorbell->page()->doorbell.notify();
  }

  // Submits the next allreduce of `local_rank`: every tensor ready now, or readiness marked later.
  uint64_t submit(int local_rank, bool all_ready) {
    TestClient& client = clients[static_cast<size_t>(local_rank)];
    SubmitEntry entry;
    entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
    entry.set_id = 0;
    entry.op_seq = client.next_seq++;
    entry.op = static_cast<uint32_t>(OpKind::kAllreduce);
    entry.reduce_op = static_cast<uint32_t>(WireReduceOp::kSum);
    entry.scaling = static_cast<uint32_t>(WireScaling::kAfter);
    entry.flags = all_ready ? kSubmitAllReady : 0;
    push(local_rank, entry);
    return entry.op_seq;
  }

  void mark_ready(int local_rank, uint64_t seq, uint32_t tensor) {
    SubmitEntry entry;
    entry.kind = static_cast<uint32_t>(SubmitKind::kMarkReady);
    entry.op_seq = seq;
    entry.tensor_index = tensor;
    push(local_rank, entry);
  }

  // The worker consumed every entry, acted on them, and went to sleep on the doorbell: what it
  // has not launched by now, it will not launch without new input.
  bool wait_idle(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      bool consumed = true;
      for (const auto& client : clients) consumed = consumed && client.consumed();
      if (consumed && doorbell->page()->doorbell.waiters.load() > 0) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  // The next completion of `local_rank`, or nullopt after `timeout`.
  std::optional<CompletionEntry> completion(int local_rank, std::chrono::milliseconds timeout = 5s) {
    TestClient& client = clients[static_cast<size_t>(local_rank)];
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    CompletionEntry entry;
    for (;;) {  // looks at least once, also with a zero timeout
      if (client.completions.try_pop(&entry) == PopResult::kOk) return entry;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(1ms);
    }
  }

  std::shared_ptr<ExecutorLog> executors;
  FakeBackends backends;
  ThreadPool pool{1};
  std::shared_ptr<JobDoorbell> doorbell = std::make_shared<JobDoorbell>();
  std::vector<TestClient> clients;
  std::vector<std::vector<float>> memory;
  Topology topology;
  std::shared_ptr<const TensorSet> admitted_set;
  std::unique_ptr<Worker> worker;
};

std::string text_of(const CompletionEntry& entry) { return std::string(entry.message, entry.message_length); }

using Launches = std::vector<std::pair<uint64_t, size_t>>;

}  // namespace

TEST_CASE("worker: a later bucket that is ready first waits, buckets launch in index order", "[worker]") {
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kHold;
  const uint64_t seq = h.submit(0, false);
  REQUIRE(h.submit(1, false) == seq);
  // Buckets 2 and 1 (tensors 0 and 1) are ready on both ranks; bucket 0 is not.
  for (int rank : {0, 1}) {
    h.mark_ready(rank, seq, 0);
    h.mark_ready(rank, seq, 1);
  }
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot().empty());

  for (int rank : {0, 1}) h.mark_ready(rank, seq, 2);
  REQUIRE(h.executors->wait_launched(1, 5s));
  // Bucket 0 is in flight: bucket 1 waits for its answer although it is ready.
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot() == Launches{{seq, 0}});
  h.executors->release();
  REQUIRE(h.executors->wait_launched(2, 5s));
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot() == Launches{{seq, 0}, {seq, 1}});
  CHECK_FALSE(h.completion(0, 0ms));  // not complete before its last bucket
  h.executors->release();
  REQUIRE(h.executors->wait_launched(3, 5s));
  h.executors->release();
  for (int rank : {0, 1}) {
    const auto done = h.completion(rank);
    REQUIRE(done);
    CHECK(done->op_seq == seq);
    CHECK(done->code == 0);
  }
  CHECK(h.executors->snapshot() == Launches{{seq, 0}, {seq, 1}, {seq, 2}});
}

TEST_CASE("worker: a bucket launches only once every local rank made it ready", "[worker]") {
  Harness h(1, 3);
  const uint64_t seq = h.submit(0, true);
  h.submit(1, true);
  h.submit(2, false);
  h.mark_ready(2, seq, 2);  // bucket 0 is ready everywhere now; buckets 1 and 2 wait for rank 2
  REQUIRE(h.executors->wait_launched(1, 5s));
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot() == Launches{{seq, 0}});
  h.mark_ready(2, seq, 0);  // bucket 2: still behind bucket 1
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot() == Launches{{seq, 0}});
  h.mark_ready(2, seq, 1);
  for (int rank : {0, 1, 2}) {
    const auto done = h.completion(rank);
    REQUIRE(done);
    CHECK(done->code == 0);
  }
  CHECK(h.executors->snapshot() == Launches{{seq, 0}, {seq, 1}, {seq, 2}});
}

TEST_CASE("worker: an engine that fails fails the step, explained by the cluster", "[worker]") {
  auto engine = std::make_shared<FakeEngine>(FakeEngine::Mode::kFail);
  Harness h(2, 1, std::make_unique<FakeCluster>(engine));
  h.executors->mode = ExecutorLog::Mode::kUseEngine;
  const uint64_t seq = h.submit(0, true);
  const auto done = h.completion(0);
  REQUIRE(done);
  CHECK(done->op_seq == seq);
  CHECK(done->code == static_cast<uint32_t>(ErrorCode::kPeerLost));
  CHECK_THAT(text_of(*done), Catch::StartsWith("fake cluster: node 1 is to blame (fake engine: connection to node 1 reset"));
  CHECK(engine->calls() == 1);  // the job stopped at the first failed bucket
  CHECK(h.worker->failure().code() == ErrorCode::kPeerLost);
}

TEST_CASE("worker: an exception in the worker's loop fails the job naming it, not the process", "[worker]") {
  // Memory that runs out on the worker thread (an operation's bookkeeping, a bucket's buffer)
  // once escaped the thread: std::terminate, and every job of the daemon with it.
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kThrowBadAlloc;
  const uint64_t seq = h.submit(0, true);
  h.submit(1, true);
  const auto done = h.completion(0);
  REQUIRE(done);
  CHECK(done->op_seq == seq);
  CHECK(done->code == static_cast<uint32_t>(ErrorCode::kInternal));
  CHECK_THAT(text_of(*done), Catch::Contains("the job's worker failed launching bucket 0 of operation 1: std::bad_alloc"));
  CHECK(h.worker->failure().code() == ErrorCode::kInternal);
}

TEST_CASE("worker: an engine that hangs returns within 1 s of the job's failure", "[worker]") {
  auto engine = std::make_shared<FakeEngine>(FakeEngine::Mode::kHangUntilAborted);
  Harness h(2, 1, std::make_unique<FakeCluster>(engine));
  h.executors->mode = ExecutorLog::Mode::kUseEngine;
  const uint64_t seq = h.submit(0, true);
  REQUIRE(h.executors->wait_launched(1, 5s));
  REQUIRE(h.wait_idle());
  CHECK_FALSE(h.completion(0, 0ms));

  const auto start = std::chrono::steady_clock::now();
  h.worker->fail(Status::peer_lost("job worker-test: rank 0's client went away"));
  const auto done = h.completion(0, 5s);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  REQUIRE(done);
  CHECK(done->op_seq == seq);
  CHECK(done->code == static_cast<uint32_t>(ErrorCode::kPeerLost));
  CHECK_THAT(text_of(*done), Catch::Contains("rank 0's client went away"));
  CHECK(elapsed < 1s);
  // The stop that follows does not wait either: the bucket in flight came back.
  const auto stop_start = std::chrono::steady_clock::now();
  h.worker->stop(Status::aborted("test over"));
  CHECK(std::chrono::steady_clock::now() - stop_start < 1s);
}

TEST_CASE("worker: an engine that times out fails the step with the engine's timeout", "[worker]") {
  auto engine = std::make_shared<FakeEngine>(FakeEngine::Mode::kTimeOut, 100ms);
  Harness h(2, 1, std::make_unique<FakeCluster>(engine));
  h.executors->mode = ExecutorLog::Mode::kUseEngine;
  h.submit(0, true);
  const auto done = h.completion(0);
  REQUIRE(done);
  CHECK(done->code == static_cast<uint32_t>(ErrorCode::kTimeout));
  CHECK_THAT(text_of(*done), Catch::Contains("node 1 sent nothing for 100 ms"));
}

TEST_CASE("worker: a bucket that runs past the execution bound fails naming the bound", "[worker]") {
  // Across nodes the bound starts after one job timeout, the other nodes' allowance to reach
  // the bucket: 200 ms + 300 ms here.
  auto engine = std::make_shared<FakeEngine>(FakeEngine::Mode::kHangUntilAborted);
  Harness h(2, 1, std::make_unique<FakeCluster>(engine), 200ms, 300ms);
  h.executors->mode = ExecutorLog::Mode::kUseEngine;
  const auto start = std::chrono::steady_clock::now();
  const uint64_t seq = h.submit(0, true);
  const auto done = h.completion(0, 5s);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  REQUIRE(done);
  CHECK(done->op_seq == seq);
  CHECK(done->code == static_cast<uint32_t>(ErrorCode::kTimeout));
  CHECK_THAT(text_of(*done), Catch::Contains("bucket 0 of operation 1") &&
                                 Catch::Contains("over the execution bound of 300 ms (gradsyncd --execution-timeout-ms) "
                                                 "plus the job timeout of 200 ms"));
  CHECK(elapsed >= 500ms);
  CHECK(elapsed < 2000ms);
}

TEST_CASE("worker: a collective that takes longer than the job timeout but finishes is not a timeout",
          "[worker]") {
  // The job timeout bounds waiting for ranks and peers; a bucket that is executing is bounded by
  // the execution bound only.
  auto engine = std::make_shared<FakeEngine>(FakeEngine::Mode::kTakeTime, 600ms);
  Harness h(2, 1, std::make_unique<FakeCluster>(engine), 200ms, 10'000ms);
  h.executors->mode = ExecutorLog::Mode::kUseEngine;
  for (int step = 0; step < 2; ++step) {
    const uint64_t seq = h.submit(0, true);
    const auto done = h.completion(0, 5s);
    REQUIRE(done);
    CHECK(done->op_seq == seq);
    CHECK(done->code == 0);
    INFO(text_of(*done));
  }
  CHECK(engine->calls() == 6);  // three buckets per step
}

TEST_CASE("worker: an operation queued behind a long one is not timed out while it waits its turn",
          "[worker]") {
  // Both operations are submitted at once; the second waits 1.8 s behind the first's three
  // 600 ms buckets, far past the 200 ms job timeout, without any rank being late.
  auto engine = std::make_shared<FakeEngine>(FakeEngine::Mode::kTakeTime, 600ms);
  Harness h(2, 1, std::make_unique<FakeCluster>(engine), 200ms, 10'000ms);
  h.executors->mode = ExecutorLog::Mode::kUseEngine;
  const uint64_t first = h.submit(0, true);
  const uint64_t second = h.submit(0, true);
  for (uint64_t seq : {first, second}) {
    const auto done = h.completion(0, 10s);
    REQUIRE(done);
    INFO(text_of(*done));
    CHECK(done->op_seq == seq);
    CHECK(done->code == 0);
  }
}

TEST_CASE("worker: a rank that never marks a bucket ready times out, named, after the job timeout",
          "[worker]") {
  Harness h(1, 2, nullptr, 300ms);
  const auto start = std::chrono::steady_clock::now();
  const uint64_t seq = h.submit(0, true);
  h.submit(1, false);
  h.mark_ready(1, seq, 2);  // bucket 0 only
  const auto done = h.completion(0, 5s);
  REQUIRE(done);
  CHECK(std::chrono::steady_clock::now() - start >= 300ms);
  CHECK(done->code == static_cast<uint32_t>(ErrorCode::kTimeout));
  CHECK_THAT(text_of(*done), Catch::Contains("over the job timeout of 300 ms, for rank 1 (local rank 1) to make bucket 1 ready"));
  CHECK(h.executors->snapshot() == Launches{{seq, 0}});
}

TEST_CASE("worker: a released set is let go by its executor once its last operation completed", "[worker]") {
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kHold;
  const uint64_t first = h.submit(0, true);
  h.submit(1, true);
  const uint64_t second = h.submit(0, true);
  h.submit(1, true);
  REQUIRE(h.executors->wait_launched(1, 5s));
  // Released with bucket 0 of operation 1 in flight and operation 2 queued behind it.
  h.worker->retire_set(0);
  auto retired = [&] {
    std::lock_guard lock(h.executors->mutex);
    return h.executors->retired;
  };
  auto answer_buckets = [&](int from, int to) {  // launches [from, to), answered in turn
    for (int b = from; b < to; ++b) {
      REQUIRE(h.executors->wait_launched(static_cast<size_t>(b + 1), 5s));
      h.executors->release();
    }
  };
  answer_buckets(0, 3);
  const auto done = h.completion(0);
  REQUIRE(done);
  CHECK(done->op_seq == first);
  CHECK(done->code == 0);
  REQUIRE(h.executors->wait_launched(4, 5s));  // operation 2 runs on the released set
  CHECK(retired().empty());                     // so the executor still keeps what it needs
  answer_buckets(3, 6);
  const auto last = h.completion(0);
  REQUIRE(last);
  CHECK(last->op_seq == second);
  CHECK(last->code == 0);
  std::unique_lock lock(h.executors->mutex);
  REQUIRE(h.executors->changed.wait_for(lock, 5s, [&] { return !h.executors->retired.empty(); }));
  CHECK(h.executors->retired == std::vector<uint32_t>{0});
}

TEST_CASE("worker: a released set with nothing in flight is let go by its executor at once", "[worker]") {
  Harness h(1, 1);
  h.submit(0, true);
  const auto done = h.completion(0);
  REQUIRE(done);
  h.worker->retire_set(0);
  std::unique_lock lock(h.executors->mutex);
  REQUIRE(h.executors->changed.wait_for(lock, 5s, [&] { return !h.executors->retired.empty(); }));
  CHECK(h.executors->retired == std::vector<uint32_t>{0});
}

// What an executor lets go of only once the device is through it (a released set's NCCL
// registrations) must go in an idle job too, which launches nothing more: the worker lets its
// executors tidy whenever it is about to sleep.
TEST_CASE("worker: an idle worker lets its executors tidy", "[worker]") {
  Harness h(1, 1);
  h.submit(0, true);
  REQUIRE(h.completion(0));
  h.worker->retire_set(0);
  std::unique_lock lock(h.executors->mutex);
  const int before = h.executors->tidied;
  // The worker wakes at least every 200 ms: two more tidies within 5 s with nothing to do.
  REQUIRE(h.executors->changed.wait_for(lock, 5s, [&] { return h.executors->tidied >= before + 2; }));
}

TEST_CASE("worker: every set is admitted by its executor, a refusal fails the admission and the job", "[worker]") {
  Harness h(1, 2);
  {
    std::lock_guard lock(h.executors->mutex);
    CHECK(h.executors->admitted == std::vector<std::string>{"set 0 of job worker-test over 1 nodes"});
    h.executors->admit_error = Status::not_supported("job worker-test set 1 group 'dp' spans 2 GPUs here and 1 "
                                                     "nodes; this gradsyncd has no NCCL engine");
  }
  auto set = std::make_shared<TensorSet>(*h.admitted_set);
  set->id = 1;
  auto admitted = std::make_shared<std::promise<Status>>();
  auto answer = admitted->get_future();
  h.worker->admit_set(set, [admitted](const Status& status) { admitted->set_value(status); });
  REQUIRE(answer.wait_for(5s) == std::future_status::ready);
  const Status refused = answer.get();
  CHECK(refused.code() == ErrorCode::kNotSupported);
  CHECK_THAT(refused.message(), Catch::Contains("has no NCCL engine"));
  // The job failed with it, and no bucket was launched for the refused set.
  CHECK(h.worker->failure().code() == ErrorCode::kNotSupported);
  CHECK(h.executors->snapshot().empty());
}

}  // namespace gradsync

namespace gradsync {

TEST_CASE("worker: a settings change re-plans the operations not begun, keeping the readiness already marked",
          "[worker]") {
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kHold;
  // Operation 1 begins: its bucket 0 is in flight, held.
  const uint64_t first = h.submit(0, true);
  h.submit(1, true);
  REQUIRE(h.executors->wait_launched(1, 5s));
  // Operation 2 queues behind it, with part of its readiness marked under the old plan.
  const uint64_t second = h.submit(0, false);
  REQUIRE(h.submit(1, false) == second);
  h.mark_ready(0, second, 0);
  h.mark_ready(0, second, 1);
  h.mark_ready(1, second, 0);
  REQUIRE(h.wait_idle());
  // No cap: one bucket for the three tensors, from the first operation not begun.
  JobSettings settings;
  settings.bucket_cap = 0;
  uint64_t from = 0;
  REQUIRE(h.worker->change_settings(settings, 5s, &from).ok());
  CHECK(from == second);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(h.executors->wait_launched(static_cast<size_t>(i + 1), 5s));
    h.executors->release();
  }
  for (int rank : {0, 1}) {
    const auto done = h.completion(rank);
    REQUIRE(done);
    CHECK(done->op_seq == first);
  }
  // Operation 2 now has one bucket, not yet ready everywhere: nothing launches.
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot() == Launches{{first, 0}, {first, 1}, {first, 2}});
  h.mark_ready(0, second, 2);
  h.mark_ready(1, second, 1);
  REQUIRE(h.wait_idle());
  CHECK(h.executors->snapshot().size() == 3);
  h.mark_ready(1, second, 2);
  REQUIRE(h.executors->wait_launched(4, 5s));
  h.executors->release();
  for (int rank : {0, 1}) {
    const auto done = h.completion(rank);
    REQUIRE(done);
    CHECK(done->op_seq == second);
    CHECK(done->code == 0);
  }
  // Later operations keep the new plan.
  const uint64_t third = h.submit(0, true);
  h.submit(1, true);
  REQUIRE(h.executors->wait_launched(5, 5s));
  h.executors->release();
  REQUIRE(h.completion(0));
  CHECK(h.executors->snapshot() == Launches{{first, 0}, {first, 1}, {first, 2}, {second, 0}, {third, 0}});
  // The trace shows it: operation 2 and 3 with one bucket each.
  const auto traced = h.worker->trace()->last(0);
  REQUIRE(traced.size() >= 2);
  CHECK(traced[1].seq == second);
  CHECK(traced[1].buckets.size() == 1);
  CHECK(traced[0].buckets.size() == 3);
}

TEST_CASE("job settings: encode and decode round-trip, anything else is refused", "[worker]") {
  JobSettings s;
  s.bucket_cap = 123;
  s.execution_timeout = std::chrono::milliseconds(456);
  JobSettings back;
  REQUIRE(JobSettings::decode(s.encode(), &back));
  CHECK(back.bucket_cap == std::optional<uint64_t>(123));
  CHECK_FALSE(back.timeout);
  CHECK(back.execution_timeout == std::optional<std::chrono::milliseconds>(456));
  for (const char* bad : {"", "v2 cap=1", "v1 cap=", "v1 cap=-1", "v1 cap=1x", "v1 what=3", "v1 cap"}) {
    CHECK_FALSE(JobSettings::decode(bad, &back));
  }
  CHECK(JobSettings{}.describe() == "no change");
  CHECK(s.describe() == "bucket cap 123 bytes, execution timeout 456 ms");
}

}  // namespace gradsync

namespace gradsync {

TEST_CASE("worker: in flight names the bucket executing, not the one before it", "[worker]") {
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kHold;
  const uint64_t seq = h.submit(0, true);
  h.submit(1, true);
  REQUIRE(h.executors->wait_launched(1, 5s));
  h.executors->release();
  REQUIRE(h.executors->wait_launched(2, 5s));  // bucket 1 in flight, bucket 0 done
  REQUIRE(h.wait_idle());
  auto answer = std::make_shared<std::promise<std::vector<PendingOperation>>>();
  auto future = answer->get_future();
  h.worker->in_flight([answer](std::vector<PendingOperation> ops) { answer->set_value(std::move(ops)); });
  REQUIRE(future.wait_for(5s) == std::future_status::ready);
  const auto ops = future.get();
  REQUIRE(ops.size() == 1);
  CHECK(ops[0].seq == seq);
  REQUIRE(ops[0].buckets.size() == 2);
  CHECK(ops[0].buckets[0].bucket == 1);
  CHECK(ops[0].buckets[0].launched);
  CHECK(ops[0].buckets[1].bucket == 2);
  CHECK_FALSE(ops[0].buckets[1].launched);
  const Worker::Position position = h.worker->position();
  CHECK(position.current_seq == seq);
  CHECK(position.current_bucket == 1);
  CHECK(position.executing);
  h.executors->release();
  REQUIRE(h.executors->wait_launched(3, 5s));
  h.executors->release();
  REQUIRE(h.completion(0));
}

}  // namespace gradsync

namespace gradsync {

TEST_CASE("worker: GPU work that does not drain keeps the job's sets mapped in the backends, and the clients are told",
          "[worker]") {
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kHold;
  h.executors->drains = false;  // as a device executor whose work waits on a ready event forever
  const uint64_t seq = h.submit(0, true);
  h.submit(1, true);
  REQUIRE(h.executors->wait_launched(1, 5s));
  h.worker->fail(Status::peer_lost("a peer went away"));
  for (int rank : {0, 1}) {
    const auto done = h.completion(rank);
    REQUIRE(done);
    CHECK(done->op_seq == seq);
    CHECK_THAT(text_of(*done), Catch::Contains("a peer went away"));
    CHECK_THAT(text_of(*done), Catch::Contains("do not reuse the job's device buffers"));
  }
  h.worker->stop(Status::aborted("test over"));
  // The worker let go of its sets; the backends hold them (and their mappings) for good.
  bool kept = false;
  {
    std::lock_guard lock(h.executors->mutex);
    for (const auto& memory : h.executors->kept) kept = kept || memory.get() == h.admitted_set.get();
  }
  CHECK(kept);
}

TEST_CASE("worker: GPU work that drains leaves nothing kept", "[worker]") {
  Harness h(1, 2);
  h.executors->mode = ExecutorLog::Mode::kHold;
  h.submit(0, true);
  h.submit(1, true);
  REQUIRE(h.executors->wait_launched(1, 5s));
  h.worker->fail(Status::peer_lost("a peer went away"));
  const auto done = h.completion(0);
  REQUIRE(done);
  CHECK_THAT(text_of(*done), !Catch::Contains("do not reuse"));
  h.worker->stop(Status::aborted("test over"));
  std::lock_guard lock(h.executors->mutex);
  CHECK(h.executors->kept.empty());
}

}  // namespace gradsync

