// Reduce-scatter within one node through the real daemon and real client processes: each rank's
// shard (shared/shard.h) of every dtype and reduce mode, checked bit-exact against the
// reference in values.cc, with 2 and 3 ranks, separate tensors and flat buffers, one bucket and
// buckets cut through the shards. The cross-node cases are in multinode_test.cc.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

#include "shared/shard.h"
#include "tests/integration/harness.h"
#include "tests/integration/values.h"

namespace gradsync::test {
namespace {

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                            DType::kInt32,   DType::kInt64,   DType::kUInt8};
// 10'045 elements: over 3 ranks the shards (3'349, 3'349, 3'347) cut the last tensor twice.
const uint64_t kSizes[] = {1, 37, 10'007};

std::vector<ReduceOptions> modes(DType dtype) {
  std::vector<ReduceOptions> all = {ReduceOptions{ReduceOp::kSum}, ReduceOptions{ReduceOp::kMin},
                                    ReduceOptions{ReduceOp::kMax}};
  if (dtype_is_floating(dtype)) {
    all.push_back(ReduceOptions{ReduceOp::kAvg, Scaling::kAfter});
    all.push_back(ReduceOptions{ReduceOp::kAvg, Scaling::kBefore});
    all.push_back(ReduceOptions{ReduceOp::kAvg, Scaling::kAfter, 5.0});
    all.push_back(ReduceOptions{ReduceOp::kAvg, Scaling::kAfter, 0, false});
  }
  return all;
}

// Checks this rank's shard of `set` against the reference, and that its inputs are untouched.
int check_shard(const TensorSet& set, const std::vector<uint64_t>& sizes, const ReduceOptions& options, int rank,
                int world, int seed) {
  uint64_t total = 0;
  for (uint64_t n : sizes) total += n;
  const ShardRange want = shard_of(total, static_cast<uint64_t>(world), static_cast<uint64_t>(rank));
  const SharedTensor shard = set.shard();
  if (set.shard_first() != want.first || shard.numel() != want.count) {
    return fail("rank " + std::to_string(rank) + "'s shard is [" + std::to_string(set.shard_first()) + ", +" +
                std::to_string(shard.numel()) + "), not [" + std::to_string(want.first) + ", +" +
                std::to_string(want.count) + ")");
  }
  const DType dtype = set.tensor(0).dtype();
  const size_t size = dtype_size(dtype);
  uint64_t flat = 0;
  for (uint64_t t = 0; t < sizes.size(); ++t) {
    for (uint64_t i = 0; i < sizes[t]; ++i, ++flat) {
      const auto input = input_bytes(dtype, rank, t, i, seed);
      if (std::memcmp(set.tensor(t).data() + i * size, input.data(), size) != 0) {
        return fail("reduce_scatter changed its input: tensor " + std::to_string(t) + " element " + std::to_string(i));
      }
      if (flat < want.first || flat >= want.first + want.count) continue;
      const auto expected = expected_reduction(dtype, options, world, t, i, seed);
      if (std::memcmp(shard.data() + (flat - want.first) * size, expected.data(), size) != 0) {
        return fail("reduce_scatter: " + std::string(dtype_name(dtype)) + " rank " + std::to_string(rank) +
                    " shard element " + std::to_string(flat - want.first) + " (tensor " + std::to_string(t) +
                    " element " + std::to_string(i) + ") differs from the reference");
      }
    }
  }
  return kOk;
}

int scenario(const std::string& socket, const std::string& job, int rank, int world, bool flat,
             std::optional<uint64_t> cap) {
  auto client = join(socket, job, rank, world);
  int seed = 400;
  for (const std::vector<uint64_t>& sizes : {std::vector<uint64_t>(std::begin(kSizes), std::end(kSizes)),
                                             std::vector<uint64_t>{1}}) {
    for (DType dtype : kAllDTypes) {
      std::vector<TensorSpec> specs;
      for (uint64_t n : sizes) specs.push_back(TensorSpec{dtype, n, "dp"});
      std::vector<SharedTensor> tensors;
      if (flat) {
        tensors = client->allocate_flat(specs);
      } else {
        for (const auto& spec : specs) tensors.push_back(client->allocate(spec));
      }
      RegisterOptions options;
      options.bucket_cap_bytes = cap;
      options.reduce_scatter = true;
      const TensorSet set = client->register_tensors(tensors, options);
      for (const ReduceOptions& mode : modes(dtype)) {
        ++seed;
        for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
        if (!client->reduce_scatter(set, mode).wait(std::chrono::seconds(30))) return fail("reduce_scatter timed out");
        if (int code = check_shard(set, sizes, mode, rank, world, seed); code != kOk) return code;
      }
    }
  }
  return kOk;
}

void run(int world, bool flat, std::optional<uint64_t> cap, const std::string& name) {
  TestDaemon daemon;
  const std::string job = unique_job(name);
  ClientGroup group(world, [&](int rank) { return scenario(daemon.socket(), job, rank, world, flat, cap); });
  for (int status : group.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
}

}  // namespace

TEST_CASE("reduce_scatter: each of 3 ranks gets its shard, every dtype and mode, bit-exact", "[integration][ops]") {
  run(3, false, std::nullopt, "rs3-separate");
}

TEST_CASE("reduce_scatter: 2 ranks, flat buffers, buckets of 4 KiB cut through the shards", "[integration][ops]") {
  run(2, true, 4096, "rs2-flat");
}

TEST_CASE("reduce_scatter: 3 ranks, one bucket per set", "[integration][ops]") { run(3, true, 0, "rs3-one-bucket"); }

TEST_CASE("reduce_scatter: a set of mixed dtypes or without the output is refused, naming why", "[integration][ops]") {
  TestDaemon daemon;
  const std::string job = unique_job("rs-refused");
  ClientGroup group(1, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 1);
    std::vector<SharedTensor> mixed = {client->allocate(TensorSpec{DType::kFloat32, 4, "dp"}),
                                       client->allocate(TensorSpec{DType::kFloat16, 4, "dp"})};
    try {
      RegisterOptions options;
      options.reduce_scatter = true;
      client->register_tensors(mixed, options);
      return fail("a mixed-dtype reduce-scatter set was registered");
    } catch (const Error& e) {
      if (e.status().message().find("tensor 1 is float16 in group 'dp' but tensor 0 is float32") == std::string::npos) {
        return fail("unexpected error: " + e.status().message());
      }
    }
    const TensorSet plain = client->register_tensors(mixed, RegisterOptions{});
    try {
      client->reduce_scatter(plain, ReduceOptions{ReduceOp::kSum});
      return fail("reduce_scatter ran on a set without an output");
    } catch (const Error& e) {
      if (e.status().message().find("without RegisterOptions::reduce_scatter") == std::string::npos) {
        return fail("unexpected error: " + e.status().message());
      }
    }
    // The client and the job still work.
    const TensorSet one = client->register_tensors(std::span(mixed.data(), 1), RegisterOptions{.reduce_scatter = true});
    fill(one.tensor(0), 0, 0, 1);
    if (!client->reduce_scatter(one, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(30))) {
      return fail("reduce_scatter timed out");
    }
    return check_shard(one, {4}, ReduceOptions{ReduceOp::kSum}, 0, 1, 1);
  });
  for (int status : group.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
}

}  // namespace gradsync::test
