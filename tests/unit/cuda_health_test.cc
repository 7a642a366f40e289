// Fused health on device sets: the health functor against the host's (reduce/simd.h) bit for
// bit, and the CUDA executor reading each bucket's result once the scatter wrote it, answering
// only once the GPU is through (the answer carries the health), on one GPU and across two.
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>

#include "cuda_fixture.h"
#include "daemon/backend/cuda/health_functor.h"
#include "daemon/reduce/simd.h"

namespace gradsync::cuda {

using namespace testing;  // the fixture, the fake device and engines (cuda_fixture.h)

namespace {

constexpr DType kFloating[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

// "" when the two blocks agree: the same flag, and the same sum bit for bit, except that two
// NaN sums match whatever their bits (a NaN's payload is the processor's, docs/gpu.md).
std::string block_difference(const reduce::HealthBlock& got, const reduce::HealthBlock& want) {
  if (got.nonfinite != want.nonfinite) {
    return "nonfinite " + std::to_string(got.nonfinite) + ", want " + std::to_string(want.nonfinite);
  }
  if (std::isnan(got.sum_sq) && std::isnan(want.sum_sq)) return "";
  if (std::memcmp(&got.sum_sq, &want.sum_sq, sizeof(double)) != 0) {
    std::ostringstream text;
    text.precision(17);
    text << "sum_sq " << got.sum_sq << ", want " << want.sum_sq;
    return text.str();
  }
  return "";
}

reduce::HealthBlock functor_health(DType dtype, const HealthItem& item) {
  reduce::HealthBlock block;
  REQUIRE(dispatch_health(dtype, [&]<typename Codec>() {
            block = health_of_item<Codec>(item);
            return Status();
          }).ok());
  return block;
}

// Moderate values in every client's tensors (the fixture's random ones hold an inf in nearly
// every block).
void fill_moderate(Fixture& f, DType dtype) {
  for (int c = 0; c < kClients; ++c) {
    for (size_t t = 0; t < f.set->layout.size(); ++t) {
      for (uint64_t i = 0; i < f.set->layout[t].numel; ++i) {
        const double v = static_cast<double>(static_cast<int>((i * 7 + c * 3 + t) % 17) - 8) / 4;
        reduce::cases::store_exact(dtype, f.set->address[c][t] + i * dtype_size(dtype), v);
      }
    }
  }
}

// An allreduce with health of every bucket of the fixture's set, each answered ok; across two
// GPUs (`engines` given) not at enqueue, even device-ordered, but once the GPUs are through.
std::shared_ptr<std::vector<reduce::HealthBlock>> allreduce_with_health(Fixture& f, CudaExecutor& executor,
                                                                        HostDeviceEngines* engines,
                                                                        const reduce::KernelArgs& args) {
  auto health = std::make_shared<std::vector<reduce::HealthBlock>>(f.set->health_blocks);
  for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) {
    BucketCall call = f.call(OpKind::kAllreduce, 1, b);
    call.args = args;
    call.desc.health = true;
    call.health = health;
    if (engines) {
      REQUIRE(launch_and_finish(f, executor, *engines, call, true).ok());
    } else {
      std::optional<Status> answer;
      executor.launch(call, [&](const Status& s) { answer = s; });
      REQUIRE(answer.has_value());
      REQUIRE(answer->ok());
    }
  }
  return health;
}

}  // namespace

TEST_CASE("cuda health: the functor's blocks equal the host's bit for bit, every floating dtype", "[cuda][health]") {
  std::mt19937_64 rng(20261204);
  for (DType dtype : kFloating) {
    for (reduce::cases::Nans nans : {reduce::cases::Nans::kExcluded, reduce::cases::Nans::kIncluded}) {
      for (uint32_t count : {1u, 31u, 32u, 33u, 1000u, 4095u, 4096u}) {
        for (int trial = 0; trial < 4; ++trial) {
          INFO(dtype_name(dtype) << ", " << count << " elements, NaNs " << (nans == reduce::cases::Nans::kIncluded)
                                 << ", trial " << trial);
          Bytes data(count * dtype_size(dtype));
          reduce::cases::fill_random(dtype, data, count, nans, rng);
          // Trial 0 keeps only moderate values (most random blocks hold an inf somewhere).
          if (trial == 0) {
            for (uint32_t i = 0; i < count; ++i) {
              const double v = static_cast<double>(static_cast<int>(i % 17) - 8) / 4;
              reduce::cases::store_exact(dtype, data.data() + i * dtype_size(dtype), v);
            }
          }
          const reduce::HealthBlock want = reduce::simd::health(dtype, data.data(), count);
          const reduce::HealthBlock got = functor_health(dtype, HealthItem{data.data(), 0, count});
          CHECK(block_difference(got, want) == "");
          if (trial == 0) CHECK(got.nonfinite == 0);
        }
      }
    }
  }
  // Finite random values with full mantissas, whose sums depend on the order of the additions:
  // the functor's lane order must be the host's, which a plain in-order sum is not.
  for (DType dtype : kFloating) {
    INFO(dtype_name(dtype) << ", finite random values");
    const uint32_t count = reduce::kHealthBlockElements;
    Bytes data(count * dtype_size(dtype));
    std::uniform_real_distribution<double> uniform(-4.0, 4.0);
    for (uint32_t i = 0; i < count; ++i) test::store_as(dtype, data.data() + i * dtype_size(dtype), uniform(rng));
    const reduce::HealthBlock want = reduce::simd::health(dtype, data.data(), count);
    CHECK(block_difference(functor_health(dtype, HealthItem{data.data(), 0, count}), want) == "");
    double plain = 0;
    for (uint32_t i = 0; i < count; ++i) plain = plain + reduce::simd::health(dtype, data.data() + i * dtype_size(dtype), 1).sum_sq;
    // The data tells the orders apart for float32 and float64; a half type's squares and their
    // sums are exact in float64 (few mantissa bits), so every order gives the same bits there.
    if (dtype == DType::kFloat32 || dtype == DType::kFloat64) CHECK(plain != want.sum_sq);
  }
  // A float64 above 1e154 squares to an inf, but is finite: not flagged.
  const double big[2] = {1e200, 1.0};
  const reduce::HealthBlock block = functor_health(DType::kFloat64, HealthItem{big, 0, 2});
  CHECK(block.nonfinite == 0);
  CHECK(std::isinf(block.sum_sq));
  CHECK(dispatch_health(DType::kInt32, [&]<typename Codec>() { return Status(); }).code() ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("cuda executor: a retired set's health tables are freed with its gather and scatter tables",
          "[cuda][executor][health]") {
  Fixture f(DType::kFloat32);
  CudaExecutor executor(options_for(f, nullptr));
  REQUIRE(f.run(executor, OpKind::kAllreduce, reduce::KernelArgs{}).ok());
  executor.retire_set(f.set->id);
  const size_t kept = f.api.allocations.size();  // what outlives a set: the bucket buffer
  auto health = std::make_shared<std::vector<reduce::HealthBlock>>(f.set->health_blocks);
  for (size_t b = 0; b < f.set->plan.buckets.size(); ++b) {
    BucketCall call = f.call(OpKind::kAllreduce, 2, b);
    call.desc.health = true;
    call.health = health;
    std::optional<Status> answer;
    executor.launch(call, [&](const Status& s) { answer = s; });
    REQUIRE(answer.has_value());
    REQUIRE(answer->ok());
  }
  // The gather and scatter tables (4 a bucket) and at least one health table a bucket.
  CHECK(f.api.allocations.size() >= kept + 5 * f.set->plan.buckets.size());
  executor.retire_set(f.set->id);
  CHECK(f.api.allocations.size() == kept);
}

TEST_CASE("cuda executor: a device allreduce's health equals the host's, answered once the GPU is through",
          "[cuda][executor][health]") {
  for (DType dtype : kFloating) {
    for (bool across : {false, true}) {
      for (bool ordered : {false, true}) {
        INFO(dtype_name(dtype) << (across ? ", clients on two GPUs" : ", one GPU")
                               << (ordered ? ", device-ordered" : ""));
        Fixture f(dtype, across ? std::vector<int>{0, 0, 1} : std::vector<int>{0, 0, 0});
        // Moderate values (the fixture's random ones hold an inf in nearly every block), and one
        // inf: in client 1's tensor 3 (9000 elements: blocks 0-2), in its second block.
        fill_moderate(f, dtype);
        test::store_as(dtype, f.set->address[1][3] + 5000 * dtype_size(dtype), INFINITY);
        f.original = f.memory;
        if (ordered) add_event_rings(f);
        std::vector<std::string> trace;
        f.kernels.trace = &trace;
        f.api.trace = &trace;
        HostDeviceEngines engines;
        {
          CudaExecutor executor(options_for(f, across ? &engines : nullptr));
          if (across) {
            LocalRendezvous local;
            REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
          }
          const reduce::KernelArgs args{.dtype = dtype, .scale = reduce::Scale::kAfter, .divisor = 3};
          const auto health = allreduce_with_health(f, executor, across ? &engines : nullptr, args);
          // Every block, against the host's health of the host's reduction.
          for (size_t t = 0; t < f.set->layout.size(); ++t) {
            const Bytes want = f.reduced(args, t);
            const uint64_t numel = f.set->layout[t].numel;
            for (uint64_t first = 0, k = 0; first < numel; first += reduce::kHealthBlockElements, ++k) {
              INFO("tensor " << t << " block " << k);
              const reduce::HealthBlock expected =
                  reduce::simd::health(dtype, want.data() + first * dtype_size(dtype),
                                       std::min<uint64_t>(reduce::kHealthBlockElements, numel - first));
              CHECK(block_difference((*health)[f.set->health_block[t] + k], expected) == "");
              CHECK((*health)[f.set->health_block[t] + k].nonfinite == (t == 3 && k == 1 ? 1u : 0u));
            }
          }
          // One health launch per bucket, after its scatter and before any client's done record
          // (a client may write its tensors again once its event fires).
          CHECK(f.kernels.healths == static_cast<int>(f.set->plan.buckets.size()));
          const auto health_at = std::find(trace.begin(), trace.end(), "health");
          REQUIRE(health_at != trace.end());
          CHECK(std::find(trace.begin(), health_at, "scatter") != health_at);
          CHECK(std::find_if(trace.begin(), health_at, [](const std::string& s) {
                  return s.rfind("record", 0) == 0;
                }) == health_at);
          if (!across) CHECK(f.api.synchronizations == static_cast<int>(f.set->plan.buckets.size()));
          CHECK(f.api.downloads == static_cast<int>(f.set->plan.buckets.size()));
        }
        CHECK(f.api.allocations.empty());  // the health tables freed with the executor
        f.set.reset();  // its event rings, before the fake device they were made on
      }
    }
  }
}

// A masked device set's health is that of its results, as on the host: the kept elements'
// reductions and zeros elsewhere. The health kernel reads the reader's tensors after the
// scatter, which zeroes the destinations before writing the kept elements back, so an inf at a
// dropped element is not found and one at a kept element is.
TEST_CASE("cuda executor: a masked device allreduce's health is its results', an inf it drops unseen",
          "[cuda][executor][health][masked]") {
  for (DType dtype : kFloating) {
    for (bool across : {false, true}) {
      INFO(dtype_name(dtype) << (across ? ", clients on two GPUs" : ", one GPU"));
      Fixture f(dtype, across ? std::vector<int>{0, 0, 1} : std::vector<int>{0, 0, 0});
      auto masked = std::make_shared<TensorSet>(*f.set);
      auto mask = std::make_shared<std::vector<uint64_t>>();
      for (uint64_t i = 0; i < masked->flat_elements; ++i) {
        if (i % 3 == 0 || (i >= 5000 && i < 6000)) mask->push_back(i);
      }
      masked->mask = mask;
      complete_tensor_set(masked.get(), f.topology);
      f.set = masked;
      fill_moderate(f, dtype);
      // Client 1's tensor 3 (9000 elements, blocks 0-2): an inf at a dropped element of block 0
      // and one at a kept element of block 2.
      const auto kept = [&](uint64_t e) {
        return std::binary_search(mask->begin(), mask->end(), f.set->flat_offset[3] + e);
      };
      uint64_t dropped = 0, held = 8200;
      while (kept(dropped)) ++dropped;
      while (!kept(held)) ++held;
      REQUIRE(dropped < reduce::kHealthBlockElements);
      REQUIRE(held >= 2 * reduce::kHealthBlockElements);
      test::store_as(dtype, f.set->address[1][3] + dropped * dtype_size(dtype), INFINITY);
      test::store_as(dtype, f.set->address[1][3] + held * dtype_size(dtype), INFINITY);
      f.original = f.memory;
      HostDeviceEngines engines;
      {
        CudaExecutor executor(options_for(f, across ? &engines : nullptr));
        if (across) {
          LocalRendezvous local;
          REQUIRE(executor.admit(*f.set, SetAdmission{"j", &local, &f.topology}).ok());
        }
        const reduce::KernelArgs args{.dtype = dtype, .scale = reduce::Scale::kAfter, .divisor = 3};
        const auto health = allreduce_with_health(f, executor, across ? &engines : nullptr, args);
        const size_t element = dtype_size(dtype);
        for (size_t t = 0; t < f.set->layout.size(); ++t) {
          // The results: the reduction at kept elements, zero elsewhere.
          Bytes want = f.reduced(args, t);
          const Bytes zero(element);
          for (uint64_t e = 0; e < f.set->layout[t].numel; ++e) {
            if (!std::binary_search(mask->begin(), mask->end(), f.set->flat_offset[t] + e)) {
              std::memcpy(want.data() + e * element, zero.data(), element);
            }
          }
          const uint64_t numel = f.set->layout[t].numel;
          for (uint64_t first = 0, k = 0; first < numel; first += reduce::kHealthBlockElements, ++k) {
            INFO("tensor " << t << " block " << k);
            const reduce::HealthBlock expected = reduce::simd::health(
                dtype, want.data() + first * element, std::min<uint64_t>(reduce::kHealthBlockElements, numel - first));
            CHECK(block_difference((*health)[f.set->health_block[t] + k], expected) == "");
            CHECK((*health)[f.set->health_block[t] + k].nonfinite == (t == 3 && k == 2 ? 1u : 0u));
          }
        }
      }
      CHECK(f.api.allocations.empty());
      f.set.reset();
    }
  }
}

}  // namespace gradsync::cuda
