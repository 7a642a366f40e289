// Masked reduction (seeds S09) within one node through the real daemon and real client
// processes: allreduce and reduce of a set registered with a mask leave the reference result
// (values.cc) at the kept elements and zero at the others, every dtype and reduce mode, bit for
// bit, with the fused health of the results (since 2026-12-06); broadcast moves every element; bad masks, masks that differ between ranks and options a
// masked set does not take are refused, naming why, and the job goes on. The cross-node cases
// (and the byte counter) are in multinode_test.cc.
#include <catch2/catch.hpp>
#include <chrono>
#include <algorithm>
#include <cstring>
#include <limits>

#include "tests/integration/harness.h"
#include "tests/integration/values.h"
#include "tests/unit/health_reference.h"

namespace gradsync::test {
namespace {

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                            DType::kInt32,   DType::kInt64,   DType::kUInt8};
// Tensor 2 keeps nothing (its bucket, with a small cap, keeps nothing); the others about one
// element in seven, first and last included. Empty tensors sit between (the planner lists a
// bucket's tensors in reverse, and an empty one shares its successor's offset); the last
// tensor keeps more than one task's worth of elements (masked.cc's kKeptPerTask).
const std::vector<uint64_t> kSizes = {1, 0, 37, 10'007, 0, 5, 300, 120'000, 0};

std::vector<uint64_t> mask_for(const std::vector<uint64_t>& sizes) {
  std::vector<uint64_t> mask;
  uint64_t flat = 0;
  for (uint64_t t = 0; t < sizes.size(); ++t) {
    for (uint64_t i = 0; i < sizes[t]; ++i, ++flat) {
      if (t == 2) continue;
      if (i == 0 || i + 1 == sizes[t] || (i * 2654435761ull >> 9) % 7 == 0) mask.push_back(flat);
    }
  }
  return mask;
}

// The fused health against the reference's over this rank's results (health_test.cc's check).
int check_health(const Work& work, const TensorSet& set, bool expect_inf, const std::string& what) {
  ReferenceHealth want;
  for (size_t t = 0; t < set.size(); ++t) {
    add_tensor_health(set.tensor(t).dtype(), set.tensor(t).data(), set.tensor(t).numel(), &want);
  }
  if (work.found_inf() != want.found_inf || want.found_inf != expect_inf) {
    return fail(what + ": found_inf " + std::to_string(work.found_inf()) + ", the results say " +
                std::to_string(want.found_inf) + ", expected " + std::to_string(expect_inf));
  }
  const double got = work.sq_norm();
  if (!(std::isnan(want.sum_sq) && std::isnan(got)) && std::memcmp(&got, &want.sum_sq, sizeof got) != 0) {
    return fail(what + ": sq_norm " + std::to_string(got) + " differs from the reference's " +
                std::to_string(want.sum_sq));
  }
  return kOk;
}

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

// Every element of the set after a masked reduction: the reference at a kept element, zero at
// the others; or, where `untouched` (a reduce's non-root), this rank's own input everywhere.
int check_masked(const TensorSet& set, const std::vector<uint64_t>& mask, const ReduceOptions& options, int rank,
                 int world, int seed, bool untouched, const std::string& what) {
  const DType dtype = set.tensor(0).dtype();
  const size_t size = dtype_size(dtype);
  const std::vector<std::byte> zero(size);
  uint64_t flat = 0;
  size_t next = 0;
  for (uint64_t t = 0; t < set.size(); ++t) {
    for (uint64_t i = 0; i < set.tensor(t).numel(); ++i, ++flat) {
      const bool kept = next < mask.size() && mask[next] == flat;
      if (kept) ++next;
      const std::vector<std::byte> want = untouched ? input_bytes(dtype, rank, t, i, seed)
                                          : kept    ? expected_reduction(dtype, options, world, t, i, seed)
                                                    : zero;
      if (std::memcmp(set.tensor(t).data() + i * size, want.data(), size) != 0) {
        return fail(what + ": " + std::string(dtype_name(dtype)) + " rank " + std::to_string(rank) + " tensor " +
                    std::to_string(t) + " element " + std::to_string(i) + (kept ? " (kept)" : " (masked out)") +
                    " differs from the reference");
      }
    }
  }
  return kOk;
}

int scenario(const std::string& socket, const std::string& job, int rank, int world, bool flat,
             std::optional<uint64_t> cap) {
  auto client = join(socket, job, rank, world);
  const std::vector<uint64_t> mask = mask_for(kSizes);
  int seed = 700;
  for (DType dtype : kAllDTypes) {
    std::vector<TensorSpec> specs;
    for (uint64_t n : kSizes) specs.push_back(TensorSpec{dtype, n, "dp"});
    std::vector<SharedTensor> tensors;
    if (flat) {
      tensors = client->allocate_flat(specs);
    } else {
      for (const auto& spec : specs) tensors.push_back(client->allocate(spec));
    }
    RegisterOptions options;
    options.bucket_cap_bytes = cap;
    options.mask = mask;
    const TensorSet set = client->register_tensors(tensors, options);
    for (const ReduceOptions& mode : modes(dtype)) {
      ++seed;
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
      // Floating sets ask for the fused health too: it must be the reference's over the results.
      ReduceOptions asked = mode;
      asked.health = dtype_is_floating(dtype);
      Work work = client->allreduce(set, asked);
      if (!work.wait(std::chrono::seconds(30))) return fail("allreduce timed out");
      if (int code = check_masked(set, mask, mode, rank, world, seed, false, "masked allreduce"); code != kOk) {
        return code;
      }
      if (asked.health) {
        if (int code = check_health(work, set, false, "masked allreduce's health"); code != kOk) return code;
      }
      ++seed;
      const int root = world - 1;
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
      if (!client->reduce(set, root, mode).wait(std::chrono::seconds(30))) return fail("reduce timed out");
      if (int code = check_masked(set, mask, mode, rank, world, seed, rank != root, "masked reduce"); code != kOk) {
        return code;
      }
    }
    if (dtype_is_floating(dtype)) {
      // An inf on rank 1 at an element the mask drops is zeroed, so not found; at a kept one it is.
      const std::vector<uint64_t>& sizes = kSizes;
      uint64_t base = 0;
      for (size_t t = 0; t < 3; ++t) base += sizes[t];  // tensor 3's first flat position
      const auto kept = [&](uint64_t i) { return std::binary_search(mask.begin(), mask.end(), base + i); };
      uint64_t dropped = 1, taken = 1;
      while (kept(dropped)) ++dropped;
      while (!kept(taken)) ++taken;
      for (const auto& [at, found] : {std::pair{dropped, false}, std::pair{taken, true}}) {
        ++seed;
        for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
        if (rank == 1) store(dtype, set.tensor(3).data(), at, std::numeric_limits<double>::infinity());
        ReduceOptions asked{ReduceOp::kSum};
        asked.health = true;
        Work work = client->allreduce(set, asked);
        if (!work.wait(std::chrono::seconds(30))) return fail("allreduce timed out");
        const std::string what = std::string("an inf at a ") + (found ? "kept" : "dropped") + " element";
        if (int code = check_health(work, set, found, what); code != kOk) return code;
      }
    }
    // Broadcast ignores the mask: every element of the root's arrives.
    ++seed;
    for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
    if (!client->broadcast(set, 0).wait(std::chrono::seconds(30))) return fail("broadcast timed out");
    for (uint64_t t = 0; t < set.size(); ++t) {
      for (uint64_t i = 0; i < set.tensor(t).numel(); ++i) {
        const auto want = input_bytes(dtype, 0, t, i, seed);
        if (std::memcmp(set.tensor(t).data() + i * want.size(), want.data(), want.size()) != 0) {
          return fail("broadcast of a masked set: tensor " + std::to_string(t) + " element " + std::to_string(i));
        }
      }
    }
  }
  return kOk;
}

void run(int world, bool flat, std::optional<uint64_t> cap, const std::string& name) {
  TestDaemon daemon;
  const std::string job = unique_job(name);
  ClientGroup group(world, [&](int rank) { return scenario(daemon.socket(), job, rank, world, flat, cap); });
  for (int status : group.wait_all(std::chrono::seconds(180))) CHECK(exit_code(status) == kOk);
}

// Runs `body`, which must throw an Error whose message holds `needle`.
template <class Body>
int expect_error(Body&& body, const std::string& needle, const std::string& what) {
  try {
    body();
    return fail(what + " was accepted");
  } catch (const Error& e) {
    if (e.status().message().find(needle) == std::string::npos) {
      return fail(what + ": unexpected error: " + e.status().message());
    }
  }
  return kOk;
}

}  // namespace

TEST_CASE("masked: allreduce and reduce keep only the mask's elements, 3 ranks, every dtype and mode, bit-exact",
          "[integration][ops][masked]") {
  run(3, false, std::nullopt, "mask3-separate");
}

TEST_CASE("masked: 2 ranks, flat buffers, a bucket per tensor (one keeping nothing)", "[integration][ops][masked]") {
  run(2, true, 64, "mask2-flat");
}

TEST_CASE("masked: bad masks, masks that differ between ranks and options a masked set refuses are named",
          "[integration][ops][masked]") {
  TestDaemon daemon;
  const std::string job = unique_job("mask-refused");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 10, "dp"}),
                                               client->allocate(TensorSpec{DType::kFloat32, 6, "dp"})};
    // Refused by the client before anything reaches the daemon (set ids stay aligned).
    if (int c = expect_error([&] { client->register_tensors(tensors, RegisterOptions{.mask = {3, 2}}); },
                             "mask: index 1 (2) does not follow index 0 (3)", "an unsorted mask");
        c != kOk) {
      return c;
    }
    if (int c = expect_error([&] { client->register_tensors(tensors, RegisterOptions{.mask = {0, 16}}); },
                             "mask: index 1 is 16, past the set's 16 elements", "a mask past the set");
        c != kOk) {
      return c;
    }
    // The daemon: a reduce-scatter output beside a mask.
    if (int c = expect_error(
            [&] { client->register_tensors(tensors, RegisterOptions{.reduce_scatter = true, .mask = {1}}); },
            "a masked set cannot have a reduce-scatter output", "a masked reduce-scatter set");
        c != kOk) {
      return c;
    }
    // Ranks that give different masks: the registration fails on both, naming both ranks.
    const std::vector<uint64_t> mine = rank == 0 ? std::vector<uint64_t>{1, 2, 3} : std::vector<uint64_t>{1, 2, 4};
    if (int c = expect_error([&] { client->register_tensors(tensors, RegisterOptions{.mask = mine}); },
                             "rank 0 registered a mask keeping 3 elements, rank 1 a mask keeping 3 elements (other "
                             "indices); every rank gives the same mask",
                             "different masks");
        c != kOk) {
      return c;
    }
    const TensorSet set = client->register_tensors(tensors, RegisterOptions{.mask = {0, 9, 10, 15}});
    // The job still reduces.
    for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, 9);
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(30))) {
      return fail("allreduce timed out");
    }
    return check_masked(set, {0, 9, 10, 15}, ReduceOptions{ReduceOp::kSum}, rank, 2, 9, false, "after refusals");
  });
  for (int status : group.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
}

}  // namespace gradsync::test
