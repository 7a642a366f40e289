// The host cross-node path against an engine whose library thread is still inside a call after
// abort() answered it (a Gloo thread descheduled past the engine's 500 ms wait, mid-combine):
// what the call writes into, a client's tensor or the node buffers, must stay allocated and
// mapped until the engine lets go of the call, and must not be handed to the next bucket.
// Built with AddressSanitizer (with cross_node.cc), which also catches a late write into freed
// memory that no assertion here could see.
#include "daemon/backend/host/cross_node.h"

#include <sanitizer/asan_interface.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>

#include "daemon/reduce/staged.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"

namespace gradsync::host {
namespace {

// Answers an abort at once but keeps the call, as the Gloo engine does with a call its thread
// has not left; leave() is that thread finally coming out: it writes into the call's buffer
// (the late combine step) and lets go of the call's Done.
class LingeringEngine final : public HostCollectiveEngine {
 public:
  int node() const override { return 0; }
  int nodes() const override { return 2; }

  void allreduce(void* data, size_t count, const ReduceSpec& spec, EngineDone done) override {
    hold(data, count * dtype_size(spec.wire.value_or(reduce::accumulation_dtype(spec.element))), std::move(done));
  }
  void broadcast(void* data, size_t bytes, int, EngineDone done) override { hold(data, bytes, std::move(done)); }
  void allgather(const void*, size_t bytes, void* out, EngineDone done) override {
    hold(out, bytes * 2, std::move(done));
  }
  void reduce(void* data, size_t count, const ReduceSpec& spec, int, EngineDone done) override {
    hold(data, count * dtype_size(spec.wire.value_or(reduce::accumulation_dtype(spec.element))), std::move(done));
  }
  void reduce_scatter(void* data, std::span<const uint64_t> counts, const ReduceSpec& spec,
                      EngineDone done) override {
    uint64_t count = 0;
    for (uint64_t part : counts) count += part;
    scattered_ = true;
    hold(data, count * dtype_size(spec.wire.value_or(reduce::accumulation_dtype(spec.element))), std::move(done));
  }
  // Whether a reduce_scatter call was made (the test thread reads it once the call was).
  bool scattered() const { return scattered_; }

  void abort(const Status& why) override {
    EngineDone answer;
    {
      std::lock_guard lock(mutex_);
      if (!aborted_.ok()) return;
      aborted_ = why;
      answer = held_.done;  // a copy: the call itself is kept
    }
    if (answer) answer(why);
  }

  bool wait_called(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return called_.wait_for(lock, timeout, [&] { return held_.done != nullptr; });
  }

  // The library thread comes out of the call: one late write, then the call is let go.
  void leave() {
    Held left;
    {
      std::lock_guard lock(mutex_);
      left = std::move(held_);
      held_ = Held{};
    }
    if (left.data) std::memset(left.data, 0xee, left.bytes);
  }

 private:
  struct Held {
    void* data = nullptr;
    size_t bytes = 0;
    EngineDone done;
  };

  void hold(void* data, size_t bytes, EngineDone done) {
    std::unique_lock lock(mutex_);
    if (!aborted_.ok()) {
      const Status why = aborted_;
      lock.unlock();
      return done(why);  // later calls fail at once and are not kept
    }
    held_ = Held{data, bytes, std::move(done)};
    called_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable called_;
  Status aborted_;  // guarded by mutex_
  Held held_;       // guarded by mutex_
  std::atomic<bool> scattered_{false};
};

// Host memory standing in for a client's mapped segment; records when it is released.
class WatchedRegion final : public MemoryRegion {
 public:
  WatchedRegion(size_t bytes, std::shared_ptr<std::atomic<bool>> released)
      : bytes_(bytes), released_(std::move(released)) {}
  ~WatchedRegion() override { *released_ = true; }
  MemoryKind kind() const override { return MemoryKind::kHostMemfd; }
  size_t size() const override { return bytes_.size(); }
  std::byte* base() const override { return const_cast<std::byte*>(bytes_.data()); }

 private:
  std::vector<std::byte> bytes_;
  std::shared_ptr<std::atomic<bool>> released_;
};

// A segment mapped right after another: a view of part of one allocation. Its release poisons
// the view, as an unmap would make it fault.
class AdjacentRegion final : public MemoryRegion {
 public:
  AdjacentRegion(std::shared_ptr<std::vector<std::byte>> backing, size_t offset, size_t bytes,
                 std::shared_ptr<std::atomic<bool>> released)
      : backing_(std::move(backing)), offset_(offset), bytes_(bytes), released_(std::move(released)) {}
  ~AdjacentRegion() override {
    *released_ = true;
    ASAN_POISON_MEMORY_REGION(base(), bytes_);
  }
  MemoryKind kind() const override { return MemoryKind::kHostMemfd; }
  size_t size() const override { return bytes_; }
  std::byte* base() const override { return backing_->data() + offset_; }

 private:
  std::shared_ptr<std::vector<std::byte>> backing_;
  size_t offset_, bytes_;
  std::shared_ptr<std::atomic<bool>> released_;
};

// One rank on node 0 of two, and one bucket of its tensors.
struct OneBucket {
  // One tensor of `numel` elements in a region of its own (its release sets *released).
  OneBucket(DType dtype, uint64_t numel) {
    build(dtype, {std::make_shared<WatchedRegion>(numel * dtype_size(dtype), released)});
  }
  // One tensor filling each region, in order: regions side by side make one contiguous run.
  OneBucket(DType dtype, std::vector<std::shared_ptr<const MemoryRegion>> regions) {
    build(dtype, std::move(regions));
  }

  void build(DType dtype, std::vector<std::shared_ptr<const MemoryRegion>> regions) {
    REQUIRE(make_topology(2, 1, 0, 0, {}, &topology).ok());
    auto set = std::make_shared<TensorSet>();
    std::vector<std::byte*> addresses;
    for (const auto& region : regions) {
      set->layout.push_back(plan::TensorLayout{dtype, region->size() / dtype_size(dtype), "dp"});
      set->bucket_cap += region->size();
      addresses.push_back(region->base());
    }
    set->address.push_back(std::move(addresses));
    set->regions = std::move(regions);
    complete_tensor_set(set.get(), topology);
    REQUIRE(set->plan.buckets.size() == 1);
    call.seq = 1;
    call.desc.kind = OpKind::kAllreduce;
    call.set = std::move(set);
    call.topology = &topology;
    call.engine = &engine;
    call.args.dtype = dtype;
  }

  // Runs the bucket on another thread, aborts the engine once it is inside its call, and
  // returns the answer.
  Status run_and_abort(ThreadPool& pool, std::shared_ptr<NodeBuffers>& buffers) {
    auto answer = std::async(std::launch::async, [&] { return execute_across_nodes(call, pool, buffers); });
    const bool called = engine.wait_called(std::chrono::seconds(10));
    engine.abort(Status::aborted("job failed: test"));  // also ends a bucket that never called
    const Status status = answer.get();
    REQUIRE(called);
    return status;
  }

  Topology topology;
  LingeringEngine engine;
  BucketCall call;
  std::shared_ptr<std::atomic<bool>> released = std::make_shared<std::atomic<bool>>(false);
};

TEST_CASE("cross-node: a client's tensor stays mapped while an aborted engine call has not left the library",
          "[cross_node]") {
  // float32, one flat tensor: the engine works in the client's memory itself (in place).
  OneBucket b(DType::kFloat32, 4096);
  REQUIRE(b.call.set->canonical_run[0]);
  ThreadPool pool(1);
  auto buffers = std::make_shared<NodeBuffers>();
  const Status answer = b.run_and_abort(pool, buffers);
  CHECK(answer.code() == ErrorCode::kAborted);
  // The job lets go of the set, as a failed job does: the region the call writes into must
  // outlive the call; the set's tables need not.
  const std::weak_ptr<const TensorSet> set = b.call.set;
  b.call.set.reset();
  CHECK(set.expired());
  CHECK_FALSE(*b.released);
  b.engine.leave();  // the late write lands in memory that is still there
  CHECK(*b.released);
}

TEST_CASE("cross-node: every segment of an in-place run stays mapped while an aborted call has not left",
          "[cross_node]") {
  // Two float32 tensors in two segments mapped side by side: one contiguous run, in place.
  constexpr size_t kBytes = 4096 * 4;
  auto backing = std::make_shared<std::vector<std::byte>>(2 * kBytes);
  auto first_released = std::make_shared<std::atomic<bool>>(false);
  auto second_released = std::make_shared<std::atomic<bool>>(false);
  OneBucket b(DType::kFloat32, {std::make_shared<AdjacentRegion>(backing, 0, kBytes, first_released),
                                std::make_shared<AdjacentRegion>(backing, kBytes, kBytes, second_released)});
  REQUIRE(b.call.set->canonical_run[0]);
  ThreadPool pool(1);
  auto buffers = std::make_shared<NodeBuffers>();
  CHECK(b.run_and_abort(pool, buffers).code() == ErrorCode::kAborted);
  b.call.set.reset();
  CHECK_FALSE(*first_released);
  CHECK_FALSE(*second_released);  // the late write reaches into the second segment too
  b.engine.leave();
  CHECK(*first_released);
  CHECK(*second_released);
}

TEST_CASE("cross-node: node buffers an aborted engine call still holds are not reused by the next bucket",
          "[cross_node]") {
  // float16 accumulates in float32: the engine works in the node buffers (staged).
  OneBucket b(DType::kFloat16, 4096);
  ThreadPool pool(1);
  auto buffers = std::make_shared<NodeBuffers>();
  const Status answer = b.run_and_abort(pool, buffers);
  CHECK(answer.code() == ErrorCode::kAborted);
  const std::weak_ptr<NodeBuffers> held = buffers;
  const NodeBuffers* before = buffers.get();
  // The next bucket (its engine call fails at once) gets buffers of its own.
  CHECK(execute_across_nodes(b.call, pool, buffers).code() == ErrorCode::kAborted);
  CHECK(buffers.get() != before);
  CHECK_FALSE(held.expired());
  b.engine.leave();
  CHECK(held.expired());
  // With nothing holding them, the same buffers serve bucket after bucket.
  const NodeBuffers* now = buffers.get();
  CHECK(execute_across_nodes(b.call, pool, buffers).code() == ErrorCode::kAborted);
  CHECK(buffers.get() == now);
  // The calls worked in the node buffers only: they never pinned the client's memory.
  b.call.set.reset();
  CHECK(*b.released);
}

TEST_CASE("cross-node: a compressed bucket's wire buffer and a reduce-scatter's node buffer outlive an aborted call",
          "[cross_node]") {
  // A float32 bucket with bfloat16 on the wire (the staged, pipelined path: the engine carries
  // the wire buffer), and a reduce-scatter (the engine's reduce_scatter on the node buffer).
  for (const bool scatter : {false, true}) {
    INFO((scatter ? "reduce-scatter" : "bfloat16 wire"));
    OneBucket b(DType::kFloat32, 4096);
    if (scatter) {
      auto set = std::make_shared<TensorSet>(*b.call.set);
      set->shard_output = {set->address[0][0]};  // any memory: the call never finishes
      complete_tensor_set(set.get(), b.topology);
      b.call.set = set;
      b.call.desc.kind = OpKind::kReduceScatter;
    } else {
      b.call.desc.wire = DType::kBFloat16;
    }
    ThreadPool pool(1);
    auto buffers = std::make_shared<NodeBuffers>();
    CHECK(b.run_and_abort(pool, buffers).code() == ErrorCode::kAborted);
    CHECK(b.engine.scattered() == scatter);  // 2 nodes: the bucket crosses as parts
    const std::weak_ptr<NodeBuffers> held = buffers;
    buffers.reset();  // the caller lets go; the call still holds them
    CHECK_FALSE(held.expired());
    b.engine.leave();  // the late write lands in the buffers the call was given
    CHECK(held.expired());
  }
}

TEST_CASE("cross-node: the sequence check's exchange buffers outlive an aborted engine call", "[cross_node]") {
  OneBucket b(DType::kFloat32, 16);
  auto answer = std::async(std::launch::async, [&] { return check_sequence(b.call); });
  const bool called = b.engine.wait_called(std::chrono::seconds(10));
  b.engine.abort(Status::aborted("job failed: test"));
  CHECK(answer.get().code() == ErrorCode::kAborted);
  REQUIRE(called);
  b.engine.leave();  // writes both nodes' headers into the exchange: AddressSanitizer checks it
}

}  // namespace
}  // namespace gradsync::host
