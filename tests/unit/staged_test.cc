// The staged reduction (accumulate -> combiner -> finish) against the one-shot kernel
// (reduce()). The contract: on a single node, accumulate over every input then finish gives
// bit for bit what reduce() gives, for every dtype and mode, whatever the values. Across
// nodes the combination is regrouped ((a0 + a1) + (b0 + b1) instead of a0 + a1 + b0 + b1), so
// equality holds where every operation is exact, and only there.
#include "daemon/reduce/staged.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "shared/dtype.h"
#include "shared/half.h"
#include "tests/unit/dtype_store.h"
#include "tests/unit/reduce_cases.h"

namespace gradsync::reduce {
namespace {

// Not multiples of any vector width or of the kernel's block, so the kernel's chunked loops,
// scalar tails and block boundaries are all crossed.
constexpr size_t kCounts[] = {1, 37, 10007};

using namespace cases;

// reduce() over every input, into one output.
Bytes kernel_result(const KernelArgs& args, const std::vector<Bytes>& inputs, size_t count) {
  Bytes out(count * dtype_size(args.dtype), std::byte{0x5a});
  const std::vector<void*> outputs{out.data()};
  reduce(args, pointers(inputs, 0, inputs.size()), outputs, count);
  return out;
}

// finish() into two outputs, which must agree; returns the first.
Bytes finished(const KernelArgs& args, const Bytes& acc, size_t count) {
  Bytes first(count * dtype_size(args.dtype), std::byte{0xa5});
  Bytes second(count * dtype_size(args.dtype), std::byte{0x3c});
  const std::vector<void*> outputs{first.data(), second.data()};
  finish(args, acc.data(), outputs, count);
  CHECK(first_difference(second, first, dtype_size(args.dtype)) == "");
  return first;
}

// One node: accumulate over every input, then finish.
Bytes single_node_result(const KernelArgs& args, const std::vector<Bytes>& inputs, size_t count) {
  Bytes acc(count * dtype_size(accumulation_dtype(args.dtype)));
  accumulate(args, pointers(inputs, 0, inputs.size()), acc.data(), count);
  return finished(args, acc, count);
}

// Two nodes: inputs [0, split) on node A, [split, n) on node B, each accumulated, combined
// A (+) B as the engine's combine function does it (in place into A's buffer, as Gloo calls
// it), then finished.
Bytes two_node_result(const KernelArgs& args, const std::vector<Bytes>& inputs, size_t split, size_t count) {
  const size_t acc_bytes = count * dtype_size(accumulation_dtype(args.dtype));
  Bytes node_a(acc_bytes);
  Bytes node_b(acc_bytes);
  accumulate(args, pointers(inputs, 0, split), node_a.data(), count);
  accumulate(args, pointers(inputs, split, inputs.size()), node_b.data(), count);
  const CombinerFn combine = combiner(args);
  REQUIRE(combine != nullptr);
  combine(node_a.data(), node_a.data(), node_b.data(), count);
  return finished(args, node_a, count);
}

// The exact value reduce() must produce from exact inputs, computed in double: a check that
// the exact-value premise of the two-node test holds (no rounding anywhere).
double reference(const KernelArgs& args, const std::vector<double>& values) {
  double result = 0;
  for (size_t k = 0; k < values.size(); ++k) {
    const double v = args.scale == Scale::kBefore ? values[k] / args.divisor : values[k];
    if (k == 0) {
      result = v;
    } else if (args.combine == Combine::kSum) {
      result += v;
    } else if (args.combine == Combine::kMin) {
      result = v < result ? v : result;
    } else {
      result = v > result ? v : result;
    }
  }
  return args.scale == Scale::kAfter ? result / args.divisor : result;
}

double load_as_double(DType dtype, const std::byte* at) {
  auto load = [at]<typename T>(T) {
    T value;
    std::memcpy(&value, at, sizeof(T));
    return value;
  };
  switch (dtype) {
    case DType::kFloat32: return load(float{});
    case DType::kFloat64: return load(double{});
    case DType::kFloat16: return half_to_float(load(uint16_t{}));
    case DType::kBFloat16: return bfloat16_to_float(load(uint16_t{}));
    case DType::kInt32: return load(int32_t{});
    case DType::kInt64: return static_cast<double>(load(int64_t{}));
    case DType::kUInt8: return load(uint8_t{});
  }
  return 0;
}

// "" when `result` holds reference() of the inputs at every element.
std::string first_inexact(const KernelArgs& args, const std::vector<Bytes>& inputs, const Bytes& result, size_t count) {
  const size_t size = dtype_size(args.dtype);
  std::vector<double> values(inputs.size());
  for (size_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < inputs.size(); ++k) values[k] = load_as_double(args.dtype, inputs[k].data() + i * size);
    const double want = reference(args, values);
    const double got = load_as_double(args.dtype, result.data() + i * size);
    if (got != want) {
      std::ostringstream text;
      text << "element " << i << ": got " << got << ", exact result " << want;
      return text.str();
    }
  }
  return "";
}

// Like first_difference, except that two NaNs count as equal whatever their bits.
std::string first_difference_but_nan_payload(DType dtype, const Bytes& got, const Bytes& want, size_t count) {
  const size_t size = dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    const std::byte* g = got.data() + i * size;
    const std::byte* w = want.data() + i * size;
    if (std::isnan(load_as_double(dtype, g)) && std::isnan(load_as_double(dtype, w))) continue;
    if (std::memcmp(g, w, size) != 0) {
      std::ostringstream text;
      text << "element " << i << ": got " << load_as_double(dtype, g) << ", want " << load_as_double(dtype, w);
      return text.str();
    }
  }
  return "";
}

size_t nan_count(DType dtype, const Bytes& values, size_t count) {
  size_t nans = 0;
  for (size_t i = 0; i < count; ++i) nans += std::isnan(load_as_double(dtype, values.data() + i * dtype_size(dtype)));
  return nans;
}

TEST_CASE("accumulation_dtype is float32 for the half types and the dtype itself otherwise", "[staged]") {
  CHECK(accumulation_dtype(DType::kFloat16) == DType::kFloat32);
  CHECK(accumulation_dtype(DType::kBFloat16) == DType::kFloat32);
  CHECK(accumulation_dtype(DType::kFloat32) == DType::kFloat32);
  CHECK(accumulation_dtype(DType::kFloat64) == DType::kFloat64);
  CHECK(accumulation_dtype(DType::kInt32) == DType::kInt32);
  CHECK(accumulation_dtype(DType::kInt64) == DType::kInt64);
  CHECK(accumulation_dtype(DType::kUInt8) == DType::kUInt8);
}

TEST_CASE("the tested argument sets are exactly the valid ones", "[staged]") {
  // Guards the loops below: every set they run is valid, and they cover every mode.
  for (DType dtype : kAllDTypes) {
    const std::vector<KernelArgs> all = valid_args(dtype);
    for (const KernelArgs& args : all) {
      INFO(describe(args));
      CHECK(validate_kernel_args(args) == "");
    }
    const size_t per_width = dtype_is_floating(dtype) ? 7 : 3;
    CHECK(all.size() == per_width * (dtype_is_half(dtype) ? 2 : 1));
  }
}

TEST_CASE("one node: accumulate then finish is bit-identical to reduce() for any non-NaN values", "[staged]") {
  std::mt19937_64 rng(20240611);
  for (DType dtype : kAllDTypes) {
    for (const KernelArgs& args : valid_args(dtype)) {
      for (size_t count : kCounts) {
        for (size_t n = 1; n <= 4; ++n) {
          std::vector<Bytes> inputs(n, Bytes(count * dtype_size(dtype)));
          for (Bytes& input : inputs) fill_random(dtype, input, count, Nans::kExcluded, rng);
          INFO(describe(args) << ", " << n << " inputs of " << count);
          CHECK(first_difference(single_node_result(args, inputs, count), kernel_result(args, inputs, count),
                                 dtype_size(dtype)) == "");
        }
      }
    }
  }
}

TEST_CASE("one node with NaN inputs: NaN exactly where reduce() has one, min and max bit-identical",
          "[staged]") {
  // A sum of two NaNs may carry either payload (see Nans); everything else must match bit for
  // bit, and min/max, which only pick an input, must match bit for bit everywhere.
  std::mt19937_64 rng(99);
  size_t nan_results = 0;
  for (DType dtype : kAllDTypes) {
    if (!dtype_is_floating(dtype)) continue;
    for (const KernelArgs& args : valid_args(dtype)) {
      for (size_t count : kCounts) {
        for (size_t n = 1; n <= 4; ++n) {
          std::vector<Bytes> inputs(n, Bytes(count * dtype_size(dtype)));
          for (Bytes& input : inputs) fill_random(dtype, input, count, Nans::kIncluded, rng);
          const Bytes want = kernel_result(args, inputs, count);
          const Bytes got = single_node_result(args, inputs, count);
          nan_results += nan_count(dtype, want, count);
          INFO(describe(args) << ", " << n << " inputs of " << count);
          if (args.combine == Combine::kSum) {
            CHECK(first_difference_but_nan_payload(dtype, got, want, count) == "");
          } else {
            CHECK(first_difference(got, want, dtype_size(dtype)) == "");
          }
        }
      }
    }
  }
  // The values did exercise NaN propagation.
  CHECK(nan_results > 1000);
}

TEST_CASE("two nodes: accumulate, combine, finish equals reduce() when every operation is exact", "[staged]") {
  std::mt19937_64 rng(7);
  for (DType dtype : kAllDTypes) {
    for (const KernelArgs& args : valid_args(dtype)) {
      for (size_t count : kCounts) {
        for (size_t n = 2; n <= 4; ++n) {
          std::vector<Bytes> inputs(n, Bytes(count * dtype_size(dtype)));
          for (Bytes& input : inputs) fill_exact(dtype, input, count, rng);
          const Bytes want = kernel_result(args, inputs, count);
          INFO(describe(args) << ", " << n << " inputs of " << count);
          REQUIRE(first_inexact(args, inputs, want, count) == "");
          for (size_t split = 1; split < n; ++split) {
            INFO("node A has inputs [0, " << split << "), node B the rest");
            CHECK(first_difference(two_node_result(args, inputs, split, count), want, dtype_size(dtype)) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("the narrow half combiner rounds every partial result to the half type", "[staged]") {
  // 2048 + 1 is not a float16 (its spacing there is 2). Narrow accumulation rounds every
  // partial result to the half type (to even: 2048), as kernel.h's narrow path does; wide
  // accumulation keeps the float32 sum until finish().
  for (bool wide : {true, false}) {
    const KernelArgs args{.dtype = DType::kFloat16, .wide_accumulate = wide};
    const uint16_t a = float_to_half(2048.0f);
    const uint16_t b = float_to_half(1.0f);
    float node_a = half_to_float(a);
    float node_b = half_to_float(b);
    float out = 0;
    combiner(args)(&out, &node_a, &node_b, 1);
    INFO((wide ? "wide" : "narrow"));
    CHECK(out == (wide ? 2049.0f : 2048.0f));
  }
}

}  // namespace
}  // namespace gradsync::reduce
