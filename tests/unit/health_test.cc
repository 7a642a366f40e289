// The fused gradient health (daemon/reduce/health.h) against the scalar reference in
// health_reference.h, bit for bit: on every SIMD level, in the kernel's one-pass reduce(),
// in its in-place identity case, and in the staged finish() of the half types.
#include <catch2/catch.hpp>

#include <limits>
#include <random>

#include "daemon/reduce/kernel.h"
#include "daemon/reduce/simd.h"
#include "daemon/reduce/staged.h"
#include "tests/unit/health_reference.h"
#include "tests/unit/reduce_cases.h"

namespace gradsync::reduce {
namespace {

using cases::Bytes;

constexpr DType kFloating[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

// The blocks' health folded as the worker folds a set's.
test::ReferenceHealth fold(const std::vector<HealthBlock>& blocks) {
  test::ReferenceHealth total;
  for (const HealthBlock& b : blocks) {
    total.sum_sq = total.sum_sq + b.sum_sq;
    total.found_inf = total.found_inf || b.nonfinite;
  }
  return total;
}

void check_same(const test::ReferenceHealth& got, const test::ReferenceHealth& want) {
  CHECK(got.found_inf == want.found_inf);
  // Bit for bit (NaN aside, which only an inf's square can give here).
  if (!std::isnan(want.sum_sq)) CHECK(std::bit_cast<uint64_t>(got.sum_sq) == std::bit_cast<uint64_t>(want.sum_sq));
}

size_t blocks_of(size_t count) { return (count + kHealthBlockElements - 1) / kHealthBlockElements; }

}  // namespace

TEST_CASE("health: every SIMD level sums squares as the reference does, bit for bit", "[reduce][health]") {
  std::mt19937_64 rng(11);
  for (const int64_t target : simd::supported_targets()) {
    simd::pin_target_for_test(target);
    INFO("target " << simd::target_name());
    for (DType dtype : kFloating) {
      INFO(dtype_name(dtype));
      // Several blocks and a ragged tail; values over many magnitudes.
      for (size_t count : {1, 7, 8, 9, 31, 32, 33, 4095, 4096, 4097, 20'011}) {
        Bytes data(count * dtype_size(dtype));
        cases::fill_random(dtype, data, count, cases::Nans::kExcluded, rng);
        std::vector<HealthBlock> blocks(blocks_of(count));
        for (size_t b = 0; b < blocks.size(); ++b) {
          const size_t first = b * kHealthBlockElements;
          blocks[b] = simd::health(dtype, data.data() + first * dtype_size(dtype),
                                   std::min(kHealthBlockElements, count - first));
        }
        test::ReferenceHealth want;
        test::add_tensor_health(dtype, data.data(), count, &want);
        INFO(count << " elements");
        check_same(fold(blocks), want);
      }
    }
  }
  simd::pin_target_for_test(0);
}

TEST_CASE("health: an inf or a NaN anywhere is found, a large finite float64 is not", "[reduce][health]") {
  for (DType dtype : kFloating) {
    for (double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
      for (size_t at : {0, 5, 4095, 9000}) {
        Bytes data(9001 * dtype_size(dtype));
        for (size_t i = 0; i < 9001; ++i) cases::store_exact(dtype, data.data() + i * dtype_size(dtype), 0.5);
        cases::store_exact(dtype, data.data() + at * dtype_size(dtype), bad);
        std::vector<HealthBlock> blocks(blocks_of(9001));
        const void* in = data.data();
        KernelArgs args{.dtype = dtype};
        args.health = blocks.data();
        Bytes out(data.size());
        void* o = out.data();
        reduce(args, std::span<const void* const>(&in, 1), std::span<void* const>(&o, 1), 9001);
        INFO(dtype_name(dtype) << " " << bad << " at " << at);
        CHECK(fold(blocks).found_inf);
        CHECK(blocks[at / kHealthBlockElements].nonfinite == 1);
      }
    }
  }
  // 1e200 squared overflows float64, but the value is finite: not "found inf".
  Bytes big(8);
  cases::store_exact(DType::kFloat64, big.data(), 1e200);
  HealthBlock block = simd::health(DType::kFloat64, big.data(), 1);
  CHECK(block.nonfinite == 0);
  CHECK(std::isinf(block.sum_sq));
}

TEST_CASE("health: reduce() and the staged finish() report the health of what they wrote", "[reduce][health]") {
  std::mt19937_64 rng(5);
  for (DType dtype : kFloating) {
    for (const KernelArgs& base : cases::valid_args(dtype)) {
      INFO(dtype_name(dtype) << " " << cases::describe(base));
      const size_t count = 3 * kHealthBlockElements + 1234;
      std::vector<Bytes> inputs(3, Bytes(count * dtype_size(dtype)));
      for (Bytes& b : inputs) cases::fill_random(dtype, b, count, cases::Nans::kExcluded, rng);
      // One pass, out of place, into two outputs.
      {
        std::vector<HealthBlock> blocks(blocks_of(count));
        KernelArgs args = base;
        args.health = blocks.data();
        Bytes a(inputs[0].size()), b(inputs[0].size());
        std::vector<void*> outs = {a.data(), b.data()};
        reduce(args, cases::pointers(inputs, 0, 3), outs, count);
        test::ReferenceHealth want;
        test::add_tensor_health(dtype, a.data(), count, &want);
        check_same(fold(blocks), want);
      }
      // In place with one input and nothing to scale: the kernel writes nothing, and still
      // reports the health of the (unchanged) results.
      if (base.scale == Scale::kNone) {
        std::vector<HealthBlock> blocks(blocks_of(count));
        KernelArgs args = base;
        args.health = blocks.data();
        void* in_place = inputs[1].data();
        const void* in = in_place;
        reduce(args, std::span<const void* const>(&in, 1), std::span<void* const>(&in_place, 1), count);
        test::ReferenceHealth want;
        test::add_tensor_health(dtype, inputs[1].data(), count, &want);
        check_same(fold(blocks), want);
      }
      // Staged: accumulate (no health), then finish() with it.
      {
        Bytes acc(count * dtype_size(accumulation_dtype(dtype)));
        accumulate(base, cases::pointers(inputs, 0, 3), acc.data(), count);
        std::vector<HealthBlock> blocks(blocks_of(count));
        KernelArgs args = base;
        args.health = blocks.data();
        Bytes out(count * dtype_size(dtype));
        void* o = out.data();
        finish(args, acc.data(), std::span<void* const>(&o, 1), count);
        test::ReferenceHealth want;
        test::add_tensor_health(dtype, out.data(), count, &want);
        check_same(fold(blocks), want);
      }
    }
  }
}

}  // namespace gradsync::reduce
