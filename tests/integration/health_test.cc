// The fused gradient health (ReduceOptions::health) through the real daemon and real client
// processes: every rank's found_inf and sq_norm equal, bit for bit, what the reference
// (tests/unit/health_reference.h) makes of the results the rank received; an inf or a NaN on
// one rank is found on all; what health cannot apply to is refused, naming why. The cross-node
// case is in multinode_test.cc.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <limits>

#include "tests/integration/harness.h"
#include "tests/integration/values.h"
#include "tests/unit/health_reference.h"

namespace gradsync::test {
namespace {

constexpr int kWorld = 3;
const DType kFloating[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
// Health blocks are 4096 elements: one short tensor, one of several blocks and a tail.
const uint64_t kSizes[] = {37, 10'007, 1, 4096};

// What the reference makes of this rank's results.
ReferenceHealth reference(const TensorSet& set) {
  ReferenceHealth want;
  for (size_t t = 0; t < set.size(); ++t) {
    add_tensor_health(set.tensor(t).dtype(), set.tensor(t).data(), set.tensor(t).numel(), &want);
  }
  return want;
}

int check_health(const Work& work, const TensorSet& set, bool expect_inf, const std::string& what) {
  const ReferenceHealth want = reference(set);
  if (work.found_inf() != want.found_inf || want.found_inf != expect_inf) {
    return fail(what + ": found_inf " + std::to_string(work.found_inf()) + ", the results say " +
                std::to_string(want.found_inf));
  }
  const double got = work.sq_norm();
  if (!(std::isnan(want.sum_sq) && std::isnan(got)) && std::memcmp(&got, &want.sum_sq, sizeof got) != 0) {
    return fail(what + ": sq_norm " + std::to_string(got) + " differs from the reference's " +
                std::to_string(want.sum_sq));
  }
  return kOk;
}

int scenario(const std::string& socket, const std::string& job, int rank, bool flat) {
  auto client = join(socket, job, rank, kWorld);
  int seed = 700;
  for (DType dtype : kFloating) {
    std::vector<TensorSpec> specs;
    for (uint64_t n : kSizes) specs.push_back(TensorSpec{dtype, n, "dp"});
    std::vector<SharedTensor> tensors;
    if (flat) {
      tensors = client->allocate_flat(specs);
    } else {
      for (const auto& spec : specs) tensors.push_back(client->allocate(spec));
    }
    // A small cap: several buckets, each filling its own tensors' blocks.
    const TensorSet set = client->register_tensors(tensors, RegisterOptions{.bucket_cap_bytes = 16384});
    for (ReduceOptions options : {ReduceOptions{ReduceOp::kSum}, ReduceOptions{ReduceOp::kAvg},
                                  ReduceOptions{ReduceOp::kAvg, Scaling::kBefore},
                                  ReduceOptions{ReduceOp::kAvg, Scaling::kAfter, 0, false},
                                  ReduceOptions{ReduceOp::kMax}}) {
      options.health = true;
      ++seed;
      const std::string what = std::string(dtype_name(dtype)) + " seed " + std::to_string(seed);
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
      Work work = client->allreduce(set, options);
      if (!work.wait(std::chrono::seconds(30))) return fail("allreduce timed out");
      if (int code = check_health(work, set, false, what); code != kOk) return code;
      // An inf (or a NaN) on rank 1 alone is in every rank's result, and found.
      const double bad = seed % 2 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
      for (uint64_t t = 0; t < set.size(); ++t) fill(set.tensor(t), rank, t, seed);
      if (rank == 1) store(dtype, set.tensor(1).data(), 5000, bad);
      Work poisoned = client->allreduce(set, options);
      if (!poisoned.wait(std::chrono::seconds(30))) return fail("allreduce timed out");
      if (int code = check_health(poisoned, set, true, what + " with an inf or NaN on rank 1"); code != kOk) {
        return code;
      }
    }
  }
  return kOk;
}

}  // namespace

TEST_CASE("health: every rank's found_inf and sq_norm match its results bit for bit, separate tensors",
          "[integration][health]") {
  TestDaemon daemon;
  const std::string job = unique_job("health");
  ClientGroup group(kWorld, [&](int rank) { return scenario(daemon.socket(), job, rank, false); });
  for (int status : group.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
}

TEST_CASE("health: the same from a flat buffer reduced in place", "[integration][health]") {
  TestDaemon daemon;
  const std::string job = unique_job("health-flat");
  ClientGroup group(kWorld, [&](int rank) { return scenario(daemon.socket(), job, rank, true); });
  for (int status : group.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
}

TEST_CASE("health: what it cannot apply to is refused, naming why, and the job goes on", "[integration][health]") {
  TestDaemon daemon;
  const std::string job = unique_job("health-refused");
  ClientGroup group(1, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 1);
    const std::vector<SharedTensor> ints = {client->allocate(TensorSpec{DType::kInt32, 8, "dp"})};
    const TensorSet integers = client->register_tensors(ints, RegisterOptions{});
    const std::vector<SharedTensor> floats = {client->allocate(TensorSpec{DType::kFloat32, 8, "dp"})};
    const TensorSet set = client->register_tensors(floats, RegisterOptions{});
    const auto refused = [&](const std::function<void()>& call, const std::string& words) {
      try {
        call();
      } catch (const Error& e) {
        if (e.status().message().find(words) != std::string::npos) return kOk;
        return fail("unexpected error: " + e.status().message());
      }
      return fail("accepted: " + words);
    };
    ReduceOptions health{ReduceOp::kSum};
    health.health = true;
    if (int c = refused([&] { client->reduce(set, 0, health); }, "computed for allreduce only"); c != kOk) return c;
    if (int c = refused([&] { client->allreduce(integers, health); }, "hold no inf or NaN"); c != kOk) return c;
    Work plain = client->allreduce(set, ReduceOptions{ReduceOp::kSum});
    if (!plain.wait(std::chrono::seconds(30))) return fail("allreduce timed out");
    if (int c = refused([&] { (void)plain.found_inf(); }, "did not ask for it"); c != kOk) return c;
    // The job still works, with health.
    Work asked = client->allreduce(set, health);
    if (!asked.wait(std::chrono::seconds(30))) return fail("allreduce timed out");
    return asked.found_inf() ? fail("an inf in zeros") : kOk;
  });
  for (int status : group.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
}

}  // namespace gradsync::test
