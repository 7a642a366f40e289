// The staged reduction (accumulate -> combiner -> finish) against the one-shot kernel
// (reduce()). The contract: on a single node, accumulate over every input then finish gives
// bit for bit what reduce() gives, for every dtype and mode, whatever the values. Across
// nodes the combination is regrouped ((a0 + a1) + (b0 + b1) instead of a0 + a1 + b0 + b1), so
// equality holds where every operation is exact, and only there.
#include "daemon/backend/host/staged.h"

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

namespace gradsync::reduce {
namespace {

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                DType::kInt32,   DType::kInt64,   DType::kUInt8};

// Not multiples of any vector width or of the kernel's block, so the kernel's chunked loops,
// scalar tails and block boundaries are all crossed.
constexpr size_t kCounts[] = {1, 37, 10007};

using Bytes = std::vector<std::byte>;

std::string describe(const KernelArgs& args) {
  std::ostringstream text;
  text << dtype_name(args.dtype) << ' '
       << (args.combine == Combine::kSum ? "sum" : args.combine == Combine::kMin ? "min" : "max");
  if (args.scale != Scale::kNone) {
    text << (args.scale == Scale::kBefore ? " prescale /" : " postscale /") << args.divisor;
  }
  if (dtype_is_half(args.dtype)) text << (args.wide_accumulate ? " wide" : " narrow");
  return text.str();
}

// Every valid argument set for `dtype`: sum unscaled, pre- and post-scaled by 3 and by 6
// (floating dtypes only), min and max; for the half types, with wide and narrow accumulation.
std::vector<KernelArgs> valid_args(DType dtype) {
  std::vector<KernelArgs> all;
  const std::vector<bool> wide_modes = dtype_is_half(dtype) ? std::vector<bool>{true, false} : std::vector<bool>{true};
  for (bool wide : wide_modes) {
    const KernelArgs base{.dtype = dtype, .wide_accumulate = wide};
    KernelArgs args = base;
    all.push_back(args);
    if (dtype_is_floating(dtype)) {
      for (Scale scale : {Scale::kBefore, Scale::kAfter}) {
        for (double divisor : {3.0, 6.0}) {
          args = base;
          args.scale = scale;
          args.divisor = divisor;
          all.push_back(args);
        }
      }
    }
    for (Combine combine : {Combine::kMin, Combine::kMax}) {
      args = base;
      args.combine = combine;
      all.push_back(args);
    }
  }
  return all;
}

// Writes `value`, which the caller chose to be exactly representable in `dtype`.
void store_exact(DType dtype, std::byte* at, double value) { test::store_as(dtype, at, value); }

// Values that make every operation exact for up to 4 inputs, however they are grouped:
// multiples of 6 (so /3 and /6 are exact, before or after summing) no larger than 120 in
// magnitude (partial sums up to 480 = 2 * 240 fit bfloat16's 8 significant bits), including
// -0 for the floating types so that min/max ties between -0 and +0 are covered; 0..60 for
// uint8 so that 4 of them do not wrap.
void fill_exact(DType dtype, Bytes& buffer, size_t count, std::mt19937_64& rng) {
  const size_t size = dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    double value;
    if (dtype == DType::kUInt8) {
      value = 6.0 * std::uniform_int_distribution<int>(0, 10)(rng);
    } else {
      value = 6.0 * std::uniform_int_distribution<int>(-20, 20)(rng);
      if (value == 0 && dtype_is_floating(dtype) && rng() % 2 == 0) value = -0.0;
    }
    store_exact(dtype, buffer.data() + i * size, value);
  }
}

// Whether random floating values may be NaN. Which NaN payload a sum of two NaNs carries is
// the CPU's choice of operand order, and the compiler picks that order (differently for the
// kernel's vector loops and the staged scalar ones), so NaN inputs get their own test.
enum class Nans { kExcluded, kIncluded };

// A random value of a floating type with `exponent_bits` and `mantissa_bits`, as raw bits:
// mostly moderate magnitudes (so that sums round and cancel), some zeros of either sign, some
// subnormals, some anywhere in the finite range (near-overflow included), some infinities, and
// with Nans::kIncluded some NaNs with random payloads (quiet or signalling).
uint64_t random_float_bits(int exponent_bits, int mantissa_bits, int moderate_exponent_span, Nans nans,
                           std::mt19937_64& rng) {
  const uint64_t bias = (uint64_t{1} << (exponent_bits - 1)) - 1;
  const uint64_t all_ones = (uint64_t{1} << exponent_bits) - 1;  // inf/NaN exponent
  const uint64_t sign = (rng() & 1) << (exponent_bits + mantissa_bits);
  const uint64_t mantissa_mask = (uint64_t{1} << mantissa_bits) - 1;
  const uint64_t mantissa = rng() & mantissa_mask;
  switch (rng() % 16) {
    case 0:
      return sign;  // +-0
    case 1:
      return sign | mantissa;  // subnormal (or zero)
    case 2:
      return sign | ((rng() % all_ones) << mantissa_bits) | mantissa;  // any finite
    case 3:
      return sign | (all_ones << mantissa_bits);  // +-inf
    case 4:
      if (nans == Nans::kIncluded) return sign | (all_ones << mantissa_bits) | (mantissa == 0 ? 1 : mantissa);
      break;
    default:
      break;
  }
  const uint64_t exponent = bias - moderate_exponent_span + rng() % (2 * moderate_exponent_span + 1);
  return sign | (exponent << mantissa_bits) | mantissa;
}

// General values: random floats as above, and arbitrary bit patterns for the integer types (so
// integer sums wrap).
void fill_random(DType dtype, Bytes& buffer, size_t count, Nans nans, std::mt19937_64& rng) {
  const size_t size = dtype_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    std::byte* at = buffer.data() + i * size;
    switch (dtype) {
      case DType::kFloat32: test::store_raw(at, static_cast<uint32_t>(random_float_bits(8, 23, 6, nans, rng))); break;
      case DType::kFloat64: test::store_raw(at, random_float_bits(11, 52, 6, nans, rng)); break;
      case DType::kFloat16: test::store_raw(at, static_cast<uint16_t>(random_float_bits(5, 10, 4, nans, rng))); break;
      case DType::kBFloat16: test::store_raw(at, static_cast<uint16_t>(random_float_bits(8, 7, 4, nans, rng))); break;
      case DType::kInt32: test::store_raw(at, static_cast<uint32_t>(rng())); break;
      case DType::kInt64: test::store_raw(at, static_cast<uint64_t>(rng())); break;
      case DType::kUInt8: test::store_raw(at, static_cast<uint8_t>(rng())); break;
    }
  }
}

// "" when the two buffers hold the same bytes, else the first differing element (comparing the
// vectors directly would make Catch print them whole on failure).
std::string first_difference(const Bytes& got, const Bytes& want, size_t element_size) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      const size_t element = i / element_size;
      std::ostringstream text;
      text << "element " << element << " differs: bytes";
      for (size_t b = element * element_size; b < (element + 1) * element_size; ++b) {
        text << ' ' << std::hex << std::to_integer<int>(got[b]) << '/' << std::to_integer<int>(want[b]);
      }
      text << " (got/want)";
      return text.str();
    }
  }
  return "";
}

std::vector<const void*> pointers(const std::vector<Bytes>& buffers, size_t first, size_t last) {
  std::vector<const void*> result;
  for (size_t b = first; b < last; ++b) result.push_back(buffers[b].data());
  return result;
}

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
