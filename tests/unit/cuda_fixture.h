// The CUDA executor's host test fixture: three clients' tensors in host memory that says it is
// device memory (fake_device.h), a fake device engine that reduces on the host, and helpers.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "daemon/backend/cuda/events.h"
#include "daemon/backend/cuda/executor.h"
#include "daemon/reduce/staged.h"
#include "fake_device.h"
#include "tests/unit/reduce_cases.h"

namespace gradsync::cuda::testing {


using reduce::cases::Bytes;

inline constexpr int kClients = 3;

struct Fixture {
  // `flat`: each client's tensors packed back to back in registration order, as
  // allocate_device_flat lays them out (so every bucket is one canonical run: zero-copy).
  // `with_shards`: a reduce-scatter output per client, `shard_bucket_cap` the set's cap (0: one
  // bucket, the whole set).
  explicit Fixture(DType dtype, std::vector<int> device_of_client = {0, 0, 0}, bool with_gather = false,
                   bool flat = false, bool with_shards = false, std::optional<uint64_t> shard_bucket_cap = {})
      : dtype(dtype), devices(device_of_client) {
    REQUIRE(make_topology(kClients, kClients, 0, 0, {}, &topology).ok());
    auto s = std::make_shared<TensorSet>();
    s->id = 0;
    // Odd sizes, with a cap that puts several tensors in one bucket and leaves others alone.
    for (uint64_t numel : {37, 4096, 1, 9000, 515}) s->layout.push_back(plan::TensorLayout{dtype, numel, "dp"});
    s->bucket_cap = shard_bucket_cap.value_or(8192 * dtype_size(dtype));
    std::mt19937_64 rng(7);
    for (int c = 0; c < kClients; ++c) {
      uint64_t total = 0;
      for (const auto& t : s->layout) total += t.numel;
      memory.emplace_back(total * dtype_size(dtype) + 64 * s->layout.size());
      reduce::cases::fill_random(dtype, memory.back(), memory.back().size() / dtype_size(dtype),
                                 reduce::cases::Nans::kExcluded, rng);
      std::vector<std::byte*> addresses;
      size_t at = 0;
      for (const auto& t : s->layout) {
        addresses.push_back(memory.back().data() + at);
        at += flat ? t.numel * dtype_size(dtype) : (t.numel * dtype_size(dtype) + 63) / 64 * 64;
      }
      s->address.push_back(addresses);
      s->regions.push_back(std::make_shared<FakeDeviceRegion>(memory.back().data(), memory.back().size(),
                                                              device_of_client[static_cast<size_t>(c)]));
      if (with_shards) {
        // Room for the largest shard, with a marker to show what was written.
        shards.emplace_back((total + kClients - 1) / kClients * dtype_size(dtype), std::byte{0x5a});
        s->shard_output.push_back(shards.back().data());
        s->regions.push_back(std::make_shared<FakeDeviceRegion>(shards.back().data(), shards.back().size(),
                                                                device_of_client[static_cast<size_t>(c)]));
      }
      if (with_gather) {
        // Every rank's tensors, packed, rank-major; filled with a marker to show what was written.
        gathered.emplace_back(kClients * total * dtype_size(dtype), std::byte{0x5a});
        s->gather_output.push_back(gathered.back().data());
        s->regions.push_back(std::make_shared<FakeDeviceRegion>(gathered.back().data(), gathered.back().size(),
                                                                device_of_client[static_cast<size_t>(c)]));
      }
    }
    s->memory_kind = MemoryKind::kCudaVmm;
    complete_tensor_set(s.get(), topology);
    if (!shard_bucket_cap) REQUIRE(s->plan.buckets.size() >= 2);
    set = s;
    original = memory;
  }

  // Runs every bucket of the operation through the executor, in order.
  Status run(CudaExecutor& executor, OpKind kind, const reduce::KernelArgs& args, int root = 0) {
    for (size_t b = 0; b < set->plan.buckets.size(); ++b) {
      BucketCall one = call(kind, 1, b, root);
      one.args = args;
      Status answer = Status::internal("not answered");
      executor.launch(one, [&](const Status& s) { answer = s; });
      if (!answer.ok()) return answer;
    }
    return Status();
  }

  // One bucket of an operation on this fixture's set.
  BucketCall call(OpKind kind, uint64_t seq, size_t bucket = 0, int root = 0) const {
    BucketCall c;
    c.seq = seq;
    c.desc.kind = kind;
    c.desc.root = root;
    c.set = set;
    c.bucket = bucket;
    c.topology = &topology;
    return c;
  }

  // Tensor t of client c, as it is now.
  Bytes tensor(int c, size_t t) const {
    const std::byte* at = set->address[static_cast<size_t>(c)][t];
    return Bytes(at, at + set->layout[t].numel * dtype_size(dtype));
  }
  Bytes original_tensor(int c, size_t t) const {
    const size_t offset = static_cast<size_t>(set->address[static_cast<size_t>(c)][t] - memory[static_cast<size_t>(c)].data());
    const std::byte* at = original[static_cast<size_t>(c)].data() + offset;
    return Bytes(at, at + set->layout[t].numel * dtype_size(dtype));
  }
  Bytes reduced(const reduce::KernelArgs& args, size_t t) const {
    std::vector<Bytes> inputs;
    std::vector<const void*> pointers;
    for (int c = 0; c < kClients; ++c) inputs.push_back(original_tensor(c, t));
    for (const Bytes& b : inputs) pointers.push_back(b.data());
    Bytes out(set->layout[t].numel * dtype_size(dtype));
    void* const o = out.data();
    reduce::reduce(args, pointers, std::span<void* const>(&o, 1), set->layout[t].numel);
    return out;
  }

  // The reduced set, flat, as the host reduces it: what the shards are cut from.
  Bytes reduced_flat(const reduce::KernelArgs& args) const {
    Bytes flat;
    for (size_t t = 0; t < set->layout.size(); ++t) {
      const Bytes one = reduced(args, t);
      flat.insert(flat.end(), one.begin(), one.end());
    }
    return flat;
  }

  // What allgather left in client c's output for tensor t of `rank`.
  Bytes gathered_tensor(int c, int rank, size_t t) const {
    const std::byte* at = set->gather_output[static_cast<size_t>(c)] + static_cast<uint64_t>(rank) * set->packed_bytes +
                          set->packed_offset[t];
    return Bytes(at, at + set->layout[t].numel * dtype_size(dtype));
  }

  DType dtype;
  std::vector<int> devices;  // each client's GPU
  Topology topology;
  std::vector<Bytes> memory;
  std::vector<Bytes> gathered;
  std::vector<Bytes> shards;  // [client]: the reduce-scatter outputs
  std::vector<Bytes> original;
  std::shared_ptr<const TensorSet> set;
  HostBackedDeviceApi api;
  HostKernelLauncher kernels;
};

// The executor of a fixture's fake GPU, with `engines` (may be null) and, optionally, a GpuWatch
// and the job's asynchronous failure.
inline CudaExecutorOptions options_for(Fixture& f, DeviceEngineFactory* engines, GpuWatch* gpus = nullptr,
                                std::function<void(const Status&)> fail_job = {}) {
  return CudaExecutorOptions{.api = &f.api,
                             .kernels = &f.kernels,
                             .engines = engines,
                             .gpus = gpus,
                             .log = Logger(LogLevel::kError),
                             .fail_job = std::move(fail_job)};
}



// NCCL over "GPU" buffers in host memory, one node: what the executor hands a device engine,
// done on the host the way NCCL would (rank order: GPU 0's buffer first). Answers watch() only
// when finish() is called, so tests see that the executor waits for it.
class HostDeviceEngine final : public DeviceCollectiveEngine {
 public:
  explicit HostDeviceEngine(DeviceEngineSpec spec) : spec(std::move(spec)) {}
  Status connect(Rendezvous*) override { return connect_error; }
  bool reused() const override { return false; }
  bool splittable() const override { return can_split; }
  int ranks() const override { return static_cast<int>(spec.devices.size()); }
  std::span<const int> devices() const override { return spec.devices; }
  int rank_of(int node, int local_rank) const override {
    return node == 0 ? spec.slot_of_local_rank[static_cast<size_t>(local_rank)] : -1;
  }
  Status allreduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& s) override {
    calls.push_back("allreduce");
    counts.push_back(count);
    carried.push_back(s.wire.value_or(reduce::accumulation_dtype(s.element)));
    if (on_collective) on_collective();
    if (!fail_calls.ok()) return fail_calls;
    combine(buffers, count, s, -1);
    return Status();
  }
  Status broadcast(std::span<const DeviceBuffer> buffers, size_t bytes, int root) override {
    calls.push_back("broadcast from " + std::to_string(root));
    for (const auto& b : buffers) {
      if (b.data != buffers[static_cast<size_t>(root)].data) std::memcpy(b.data, buffers[static_cast<size_t>(root)].data, bytes);
    }
    return Status();
  }
  Status reduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& s, int root) override {
    calls.push_back("reduce to " + std::to_string(root));
    counts.push_back(count);
    carried.push_back(s.wire.value_or(reduce::accumulation_dtype(s.element)));
    combine(buffers, count, s, root);
    return Status();
  }
  Status allgather(std::span<const DeviceBuffer>, std::span<const DeviceBuffer>, size_t) override {
    return Status::not_supported("fake");
  }
  // As NCCL: rank r's `out` gets the r-th `count` of the reduction of every `in` (rank order);
  // in place when `out` is rank r's chunk of `in`.
  Status reduce_scatter(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t count,
                        const ReduceSpec& s) override {
    calls.push_back("reduce_scatter of " + std::to_string(count));
    if (!fail_calls.ok()) return fail_calls;
    const DType acc = reduce::accumulation_dtype(s.element);
    const size_t chunk = count * dtype_size(acc);
    std::vector<Bytes> copies;
    for (const auto& b : in) {
      const auto* at = static_cast<const std::byte*>(b.data);
      copies.emplace_back(at, at + in.size() * chunk);
    }
    for (size_t r = 0; r < out.size(); ++r) {
      std::vector<const void*> inputs;
      for (const Bytes& c : copies) inputs.push_back(c.data() + r * chunk);
      void* const o = out[r].data;
      reduce::reduce(reduce::KernelArgs{.dtype = acc, .combine = s.op}, inputs, std::span<void* const>(&o, 1), count);
    }
    return Status();
  }
  // Records what is registered, as (GPU, address); takes it when `take_registrations`.
  Status register_buffer(int device, void* data, size_t, bool* registered) override {
    registrations.emplace_back(device, data);
    *registered = take_registrations;
    return Status();
  }
  Status deregister_buffer(int device, void* data) override {
    if (!fail_deregister.ok()) return fail_deregister;
    if (on_deregister) on_deregister();
    deregistrations.emplace_back(device, data);
    return Status();
  }
  void watch(std::string what, std::function<Status(bool*)> poll, std::chrono::milliseconds,
             EngineDone done) override {
    watched.push_back(what);
    pending.push_back(Pending{std::move(poll), std::move(done)});
  }
  void abort(const Status& why) override {
    if (aborted.ok()) aborted = why;
  }
  void abandon() override { *abandoned = true; }
  // Answers the oldest watched bucket: its poll must say the GPUs are through.
  bool finish() {
    if (pending.empty()) return false;
    bool done = false;
    if (!pending.front().poll(&done).ok() || !done) return false;
    EngineDone answer = std::move(pending.front().done);
    pending.pop_front();
    answer(aborted);
    return true;
  }
  // Fails the oldest watched bucket with `why`, as the watchdog does after aborting.
  void fail_oldest(const Status& why) {
    if (aborted.ok()) aborted = why;
    EngineDone answer = std::move(pending.front().done);
    pending.pop_front();
    answer(why);
  }

  DeviceEngineSpec spec;
  bool can_split = true;
  Status connect_error;
  Status fail_calls;
  Status aborted;
  std::shared_ptr<bool> abandoned = std::make_shared<bool>(false);  // outlives the (leaked) engine
  std::vector<std::string> calls;
  std::vector<size_t> counts;  // the element count of each allreduce and reduce
  std::vector<DType> carried;  // the type NCCL is handed for each allreduce and reduce
  bool take_registrations = false;
  Status fail_deregister;
  std::function<void()> on_deregister;  // called as each deregistration is made
  std::vector<std::pair<int, void*>> registrations, deregistrations;
  std::function<void()> on_collective;  // called as each allreduce is issued
  std::vector<std::string> watched;
  struct Pending {
    std::function<Status(bool*)> poll;
    EngineDone done;
  };
  std::deque<Pending> pending;  // watched, oldest first

 private:
  // In the accumulation type, GPU 0's buffer first; into every buffer, or the root's only.
  static void combine(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& s, int root) {
    if (s.wire) return combine_wire(buffers, count, s, root);
    const DType acc = reduce::accumulation_dtype(s.element);
    std::vector<Bytes> copies;
    std::vector<const void*> inputs;
    for (const auto& b : buffers) {
      const auto* at = static_cast<const std::byte*>(b.data);
      copies.emplace_back(at, at + count * dtype_size(acc));
    }
    for (const Bytes& c : copies) inputs.push_back(c.data());
    std::vector<void*> outputs;
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (root < 0 || static_cast<int>(i) == root) outputs.push_back(buffers[i].data);
    }
    reduce::reduce(reduce::KernelArgs{.dtype = acc, .combine = s.op}, inputs, outputs, count);
  }
  // As NCCL reduces a half type: in rank order, each step widened to float32 and rounded back.
  static void combine_wire(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& s, int root) {
    Bytes result(static_cast<const std::byte*>(buffers[0].data), static_cast<const std::byte*>(buffers[0].data) + count * 2);
    const reduce::CombinerFn step = reduce::wire_combiner(s.op, *s.wire);
    for (size_t i = 1; i < buffers.size(); ++i) step(result.data(), result.data(), buffers[i].data, count);
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (root < 0 || static_cast<int>(i) == root) std::memcpy(buffers[i].data, result.data(), count * 2);
    }
  }
};

class HostDeviceEngines final : public DeviceEngineFactory {
 public:
  Status make(const DeviceEngineSpec& spec, std::unique_ptr<DeviceCollectiveEngine>* out) override {
    auto engine = std::make_unique<HostDeviceEngine>(spec);
    engine->fail_calls = fail_calls;
    engine->take_registrations = take_registrations;
    made.push_back(engine.get());
    *out = std::move(engine);
    return Status();
  }
  Status fail_calls;
  bool take_registrations = false;  // the engines' register_buffer says NCCL took the buffer
  std::vector<HostDeviceEngine*> made;  // owned by the executor
};

// Runs every bucket, finishing each through the engine when it is watched.
// Launches one bucket and returns its answer. One the executor leaves to the engine's watchdog
// is not answered while the GPUs' events are pending, and is once they are through;
// `must_wait_for_gpus`: it must be left to the watchdog (not answered at enqueue).
inline Status launch_and_finish(Fixture& f, CudaExecutor& executor, HostDeviceEngines& engines,
                                const BucketCall& call, bool must_wait_for_gpus = false) {
  std::optional<Status> answer;
  executor.launch(call, [&](const Status& s) { answer = s; });
  if (must_wait_for_gpus) CHECK_FALSE(answer.has_value());
  if (!answer) {
    // Not before the GPUs are through: the done events say so.
    f.api.events_pending = true;
    CHECK_FALSE(engines.made.front()->finish());
    CHECK_FALSE(answer.has_value());
    f.api.events_pending = false;
    REQUIRE(engines.made.front()->finish());
  }
  REQUIRE(answer.has_value());
  return *answer;
}

inline Status run_across(Fixture& f, CudaExecutor& executor, HostDeviceEngines& engines, OpKind kind,
                  const reduce::KernelArgs& args, int root = 0) {
  for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) {
    BucketCall call = f.call(kind, 1, b, root);
    call.args = args;
    if (Status answer = launch_and_finish(f, executor, engines, call); !answer.ok()) return answer;
  }
  return Status();
}



// A fixture whose clients registered event rings, as the daemon makes them.
// Every client's event rings on its own GPU, as the backend factory makes them at registration.
inline void add_event_rings(Fixture& f) {
  auto set = std::make_shared<TensorSet>(*f.set);
  for (int c = 0; c < kClients; ++c) {
    const int device = f.devices[static_cast<size_t>(c)];
    std::unique_ptr<EventRing> ready, done;
    REQUIRE(EventRing::create(&f.api, device, &ready).ok());
    REQUIRE(EventRing::create(&f.api, device, &done).ok());
    set->events.push_back(std::make_shared<ClientEventRings>(device, std::move(ready), std::move(done)));
  }
  f.set = set;
}


}  // namespace gradsync::cuda::testing
