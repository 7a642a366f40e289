// Every operation, dtype and scaling mode through the real daemon and real client processes,
// checked bit-exact against the reference in values.cc.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/values.h"

namespace gradsync::test {
namespace {

constexpr int kWorld = 3;  // odd, so avg divides by a non-power of two
const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                            DType::kInt32,   DType::kInt64,   DType::kUInt8};
// Sizes that cross the kernel's block boundary and leave ragged tails.
const uint64_t kSizes[] = {1, 37, 10'007};

struct Mode {
  const char* name;
  ReduceOptions options;
  bool floating_only;
};

std::vector<Mode> modes() {
  return {
      {"sum", ReduceOptions{ReduceOp::kSum}, false},
      {"min", ReduceOptions{ReduceOp::kMin}, false},
      {"max", ReduceOptions{ReduceOp::kMax}, false},
      {"avg (divide after)", ReduceOptions{ReduceOp::kAvg, Scaling::kAfter}, true},
      {"avg (prescale)", ReduceOptions{ReduceOp::kAvg, Scaling::kBefore}, true},
      {"avg (custom divisor 5)", ReduceOptions{ReduceOp::kAvg, Scaling::kAfter, 5.0}, true},
      {"avg (fp32 accumulate off)", ReduceOptions{ReduceOp::kAvg, Scaling::kAfter, 0, false}, true},
  };
}

// Registers one set per dtype, as separate tensors (gathered through a bucket) when `flat` is
// false, or as views of one flat buffer (reduced in place) when true.
std::vector<TensorSet> register_all(Client& client, bool flat, bool allgather) {
  std::vector<TensorSet> sets;
  for (DType dtype : kAllDTypes) {
    std::vector<TensorSpec> specs;
    for (uint64_t n : kSizes) specs.push_back(TensorSpec{dtype, n, "dp"});
    std::vector<SharedTensor> tensors;
    if (flat) {
      tensors = client.allocate_flat(specs);
    } else {
      for (const auto& spec : specs) tensors.push_back(client.allocate(spec));
    }
    sets.push_back(client.register_tensors(tensors, RegisterOptions{std::nullopt, allgather}));
  }
  return sets;
}

int check_element(const TensorSet& set, uint64_t t, uint64_t i, const std::vector<std::byte>& want,
                  const std::string& what) {
  const SharedTensor& tensor = set.tensor(t);
  const size_t size = dtype_size(tensor.dtype());
  if (std::memcmp(tensor.data() + i * size, want.data(), size) != 0) {
    return fail(what + ": " + std::string(dtype_name(tensor.dtype())) + " tensor " + std::to_string(t) + " element " +
                std::to_string(i) + " differs from the reference");
  }
  return kOk;
}

int allreduce_scenario(const std::string& socket, const std::string& job, int rank, bool flat) {
  auto client = join(socket, job, rank, kWorld);
  std::vector<TensorSet> sets = register_all(*client, flat, false);
  int seed = 0;
  for (const Mode& mode : modes()) {
    for (TensorSet& set : sets) {
      const DType dtype = set.tensor(0).dtype();
      if (mode.floating_only && !dtype_is_floating(dtype)) continue;
      ++seed;
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
      if (!client->allreduce(set, mode.options).wait(std::chrono::seconds(30))) return fail("allreduce timed out");
      for (uint64_t t = 0; t < set.size(); ++t) {
        for (uint64_t i = 0; i < set.tensor(t).numel(); ++i) {
          const auto want = expected_reduction(dtype, mode.options, kWorld, t, i, seed);
          if (int code = check_element(set, t, i, want, std::string("allreduce ") + mode.name); code != kOk) return code;
        }
      }
    }
  }
  return kOk;
}

void expect_all_ok(ClientGroup& group) {
  for (int status : group.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
}

// Memory shared with the client processes a ClientGroup forks afterwards: one zero-filled slot
// of `slot_bytes` per rank, which rank r fills and the parent reads once the ranks exited.
class SharedSlots {
 public:
  SharedSlots(int ranks, size_t slot_bytes) : slot_bytes_(slot_bytes), size_(static_cast<size_t>(ranks) * slot_bytes) {
    void* memory = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(memory != MAP_FAILED);
    data_ = static_cast<std::byte*>(memory);
  }
  ~SharedSlots() { ::munmap(data_, size_); }
  SharedSlots(const SharedSlots&) = delete;
  SharedSlots& operator=(const SharedSlots&) = delete;

  std::byte* slot(int rank) const { return data_ + static_cast<size_t>(rank) * slot_bytes_; }

 private:
  size_t slot_bytes_;
  size_t size_;
  std::byte* data_ = nullptr;
};

}  // namespace

TEST_CASE("allreduce: every dtype and scaling mode is bit-exact, separate tensors", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("allreduce-separate");
  ClientGroup group(kWorld, [&](int rank) { return allreduce_scenario(daemon.socket(), job, rank, false); });
  expect_all_ok(group);
}

TEST_CASE("allreduce: every dtype and scaling mode is bit-exact, flat buffer in place", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("allreduce-flat");
  ClientGroup group(kWorld, [&](int rank) { return allreduce_scenario(daemon.socket(), job, rank, true); });
  expect_all_ok(group);
}

TEST_CASE("allreduce: a flat buffer is planned as zero-copy buckets, separate tensors are not", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("zero-copy");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<TensorSpec> specs(4, TensorSpec{DType::kFloat32, 1000, "dp"});
    const TensorSet flat = client->register_tensors(client->allocate_flat(specs), {});
    std::vector<SharedTensor> separate;
    for (const auto& spec : specs) separate.push_back(client->allocate(spec));
    const TensorSet gathered = client->register_tensors(separate, {});
    if (flat.buckets().size() != 1 || !flat.buckets()[0].zero_copy) return fail("flat set should be one in-place bucket");
    if (gathered.buckets().size() != 1 || gathered.buckets()[0].zero_copy) {
      return fail("separate tensors should need a coalescing bucket");
    }
    return kOk;
  });
  expect_all_ok(group);
}

TEST_CASE("reduce: the root gets the reduction, other ranks keep their input", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("reduce");
  const int root = 1;
  ClientGroup group(kWorld, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, kWorld);
    std::vector<TensorSet> sets = register_all(*client, false, false);
    int seed = 100;
    for (const ReduceOptions options : {ReduceOptions{ReduceOp::kSum}, ReduceOptions{ReduceOp::kAvg}}) {
      for (TensorSet& set : sets) {
        const DType dtype = set.tensor(0).dtype();
        if (options.op == ReduceOp::kAvg && !dtype_is_floating(dtype)) continue;
        ++seed;
        for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
        if (!client->reduce(set, root, options).wait(std::chrono::seconds(30))) return fail("reduce timed out");
        for (uint64_t t = 0; t < set.size(); ++t) {
          for (uint64_t i = 0; i < set.tensor(t).numel(); ++i) {
            const auto want = rank == root ? expected_reduction(dtype, options, kWorld, t, i, seed)
                                           : input_bytes(dtype, rank, t, i, seed);
            if (int code = check_element(set, t, i, want, "reduce"); code != kOk) return code;
          }
        }
      }
    }
    return kOk;
  });
  expect_all_ok(group);
}

TEST_CASE("broadcast: every rank ends with the root's tensors", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("broadcast");
  ClientGroup group(kWorld, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, kWorld);
    std::vector<TensorSet> sets = register_all(*client, rank % 2 == 0, false);
    for (int root = 0; root < kWorld; ++root) {
      for (TensorSet& set : sets) {
        const int seed = 200 + root;
        for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
        if (!client->broadcast(set, root).wait(std::chrono::seconds(30))) return fail("broadcast timed out");
        for (uint64_t t = 0; t < set.size(); ++t) {
          for (uint64_t i = 0; i < set.tensor(t).numel(); ++i) {
            const auto want = input_bytes(set.tensor(t).dtype(), root, t, i, seed);
            if (int code = check_element(set, t, i, want, "broadcast from root " + std::to_string(root)); code != kOk) {
              return code;
            }
          }
        }
      }
    }
    return kOk;
  });
  expect_all_ok(group);
}

TEST_CASE("allgather: every rank receives every rank's tensors, by rank", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("allgather");
  ClientGroup group(kWorld, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, kWorld);
    std::vector<TensorSet> sets = register_all(*client, false, true);
    const int seed = 300;
    for (TensorSet& set : sets) {
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
      if (!client->allgather(set).wait(std::chrono::seconds(30))) return fail("allgather timed out");
      for (int source = 0; source < kWorld; ++source) {
        for (uint64_t t = 0; t < set.size(); ++t) {
          const SharedTensor got = set.gathered(source, t);
          const size_t size = dtype_size(got.dtype());
          for (uint64_t i = 0; i < got.numel(); ++i) {
            const auto want = input_bytes(got.dtype(), source, t, i, seed);
            if (std::memcmp(got.data() + i * size, want.data(), size) != 0) {
              return fail("allgather: rank " + std::to_string(source) + "'s tensor " + std::to_string(t) + " element " +
                          std::to_string(i) + " is wrong");
            }
          }
          // The inputs themselves are untouched.
          if (int code = check_element(set, t, 0, input_bytes(got.dtype(), rank, t, 0, seed), "allgather input");
              code != kOk) {
            return code;
          }
        }
      }
    }
    return kOk;
  });
  expect_all_ok(group);
}

TEST_CASE("deferred readiness: the operation waits until every rank marked every tensor", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("deferred");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    // Small cap: four buckets of two tensors each.
    const std::vector<TensorSpec> specs(8, TensorSpec{DType::kFloat32, 256, "dp"});
    const TensorSet set = client->register_tensors(client->allocate_flat(specs), RegisterOptions{2048});
    if (set.buckets().size() != 4) return fail("expected 4 buckets, got " + std::to_string(set.buckets().size()));
    for (int step = 0; step < 3; ++step) {
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, step);
      Work work = client->allreduce_deferred(set, ReduceOptions{ReduceOp::kSum});
      // Mark all but tensor 0 (in the last bucket), as hooks would fire from the back.
      for (uint32_t t = 7; t >= 1; --t) client->mark_ready(set, t);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (work.is_completed()) return fail("completed before tensor 0 was marked ready");
      client->mark_ready(set, 0);
      if (!work.wait(std::chrono::seconds(30))) return fail("deferred allreduce timed out");
      for (uint64_t t = 0; t < set.size(); ++t) {
        for (uint64_t i = 0; i < set.tensor(t).numel(); ++i) {
          const auto want = expected_reduction(DType::kFloat32, ReduceOptions{ReduceOp::kSum}, 2, t, i, step);
          if (int code = check_element(set, t, i, want, "deferred allreduce"); code != kOk) return code;
        }
      }
    }
    return kOk;
  });
  expect_all_ok(group);
}

// Allreduce leaves every rank with the same bytes, and the same inputs give the same bytes again.
TEST_CASE("results are bit-identical from run to run and on every rank", "[integration][ops]") {
  constexpr int kRanks = 4;
  constexpr uint64_t kNumel = 100'003;
  const size_t bytes = kNumel * dtype_size(DType::kBFloat16);
  TestDaemon daemon;
  const std::string job = unique_job("determinism");
  const SharedSlots results(kRanks, bytes);  // each rank's run-0 result
  ClientGroup group(kRanks, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, kRanks);
    const SharedTensor tensor = client->allocate(TensorSpec{DType::kBFloat16, kNumel, "dp"});
    const std::vector<SharedTensor> tensors = {tensor};
    const TensorSet set = client->register_tensors(tensors, {});
    std::vector<std::byte> first;
    for (int run = 0; run < 3; ++run) {
      fill(tensor, rank, 0, 7);
      if (!client->allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(30))) return fail("timed out");
      std::vector<std::byte> now(tensor.data(), tensor.data() + tensor.bytes());
      if (run == 0) first = now;
      else if (now != first) return fail("run " + std::to_string(run) + " differs from run 0");
    }
    if (first.size() != bytes) return fail("the tensor has " + std::to_string(first.size()) + " bytes");
    std::memcpy(results.slot(rank), first.data(), bytes);
    return kOk;
  });
  expect_all_ok(group);
  for (int rank = 1; rank < kRanks; ++rank) {
    INFO("rank " << rank << "'s result compared with rank 0's");
    CHECK(std::memcmp(results.slot(rank), results.slot(0), bytes) == 0);
  }
}

}  // namespace gradsync::test
