// The CUDA executor on the host: its tables, launches and ordering, with host memory standing in
// for device memory and the kernels' functors run on the host (fake_device.h). Three clients
// share "GPU 0"; every operation it supports is checked bit for bit against the host reduction.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "daemon/backend/cuda/executor.h"
#include "fake_device.h"
#include "tests/unit/reduce_cases.h"

namespace gradsync::cuda {
namespace {

using reduce::cases::Bytes;
using testing::FakeDeviceRegion;
using testing::HostBackedDeviceApi;
using testing::HostKernelLauncher;

constexpr int kClients = 3;

struct Fixture {
  explicit Fixture(DType dtype, std::vector<int> device_of_client = {0, 0, 0}) : dtype(dtype) {
    REQUIRE(make_topology(kClients, kClients, 0, 0, {}, &topology).ok());
    auto s = std::make_shared<TensorSet>();
    s->id = 0;
    // Odd sizes, with a cap that puts several tensors in one bucket and leaves others alone.
    for (uint64_t numel : {37, 4096, 1, 9000, 515}) s->layout.push_back(plan::TensorLayout{dtype, numel, "dp"});
    s->bucket_cap = 8192 * dtype_size(dtype);
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
        at += (t.numel * dtype_size(dtype) + 63) / 64 * 64;
      }
      s->address.push_back(addresses);
      s->regions.push_back(std::make_shared<FakeDeviceRegion>(memory.back().data(), memory.back().size(),
                                                              device_of_client[static_cast<size_t>(c)]));
    }
    s->memory_kind = MemoryKind::kCudaVmm;
    complete_tensor_set(s.get(), topology);
    REQUIRE(s->plan.buckets.size() >= 2);
    set = s;
    original = memory;
  }

  // Runs every bucket of the operation through the executor, in order.
  Status run(CudaExecutor& executor, OpKind kind, const reduce::KernelArgs& args, int root = 0) {
    for (size_t b = 0; b < set->plan.buckets.size(); ++b) {
      BucketCall call;
      call.seq = 1;
      call.desc.kind = kind;
      call.desc.root = root;
      call.set = set;
      call.bucket = b;
      call.topology = &topology;
      call.args = args;
      Status answer = Status::internal("not answered");
      executor.launch(call, [&](const Status& s) { answer = s; });
      if (!answer.ok()) return answer;
    }
    return Status();
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

  DType dtype;
  Topology topology;
  std::vector<Bytes> memory;
  std::vector<Bytes> original;
  std::shared_ptr<const TensorSet> set;
  HostBackedDeviceApi api;
  HostKernelLauncher kernels;
};

}  // namespace

TEST_CASE("cuda executor: allreduce over clients sharing a GPU equals reduce(), every dtype and argument set",
          "[cuda][executor]") {
  for (DType dtype : reduce::cases::kAllDTypes) {
    for (const reduce::KernelArgs& args : reduce::cases::valid_args(dtype)) {
      Fixture f(dtype);
      {
        CudaExecutor executor(&f.api, &f.kernels, Logger(LogLevel::kError));
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
  CudaExecutor executor(&f.api, &f.kernels, Logger(LogLevel::kError));
  REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  const int uploads = f.api.uploads;
  CHECK(uploads == 4 * static_cast<int>(f.set->plan.buckets.size()));  // gather and scatter: segments, items
  for (int step = 0; step < 3; ++step) REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  CHECK(f.api.uploads == uploads);
}

TEST_CASE("cuda executor: reduce lands in the root only; broadcast copies the root's bytes exactly",
          "[cuda][executor]") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    Fixture f(dtype);
    CudaExecutor executor(&f.api, &f.kernels, Logger(LogLevel::kError));
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

TEST_CASE("cuda executor: what it cannot do yet is refused, naming it", "[cuda][executor]") {
  Fixture split(DType::kFloat32, {0, 1, 0});
  CudaExecutor executor(&split.api, &split.kernels, Logger(LogLevel::kError));
  const Status across_gpus = split.run(executor, OpKind::kAllreduce, reduce::KernelArgs{});
  CHECK(across_gpus.code() == ErrorCode::kNotSupported);
  CHECK_THAT(across_gpus.message(), Catch::Contains("has participants on GPUs 0 and 1; reducing across GPUs needs the "
                                                    "NCCL engine, which is not built yet"));
  Fixture f(DType::kFloat32);
  CudaExecutor second(&f.api, &f.kernels, Logger(LogLevel::kError));
  CHECK_THAT(f.run(second, OpKind::kAllgather, reduce::KernelArgs{}).message(),
             Catch::StartsWith("allgather on device memory is not supported yet"));
  second.abort(Status::aborted("job j failed"));
  CHECK(f.run(second, OpKind::kAllreduce, reduce::KernelArgs{}).message() == "job j failed");
  CHECK(f.kernels.gathers == 0);  // nothing was launched for refused or aborted buckets
}

}  // namespace gradsync::cuda
