// Cases shared by the tests of the reduction arithmetic (the host kernel, the staged form, the
// CUDA backend's functors): every valid argument set, random and exact values for every
// dtype, and a byte comparison that names the first differing element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/reduce/kernel.h"
#include "shared/dtype.h"
#include "tests/unit/dtype_store.h"

namespace gradsync::reduce::cases {

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                DType::kInt32,   DType::kInt64,   DType::kUInt8};

using Bytes = std::vector<std::byte>;

inline std::string describe(const KernelArgs& args) {
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
inline std::vector<KernelArgs> valid_args(DType dtype) {
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
inline void store_exact(DType dtype, std::byte* at, double value) { test::store_as(dtype, at, value); }

// Values that make every operation exact for up to 4 inputs, however they are grouped:
// multiples of 6 (so /3 and /6 are exact, before or after summing) no larger than 120 in
// magnitude (partial sums up to 480 = 2 * 240 fit bfloat16's 8 significant bits), including
// -0 for the floating types so that min/max ties between -0 and +0 are covered; 0..60 for
// uint8 so that 4 of them do not wrap.
inline void fill_exact(DType dtype, Bytes& buffer, size_t count, std::mt19937_64& rng) {
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
inline uint64_t random_float_bits(int exponent_bits, int mantissa_bits, int moderate_exponent_span, Nans nans,
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
inline void fill_random(DType dtype, Bytes& buffer, size_t count, Nans nans, std::mt19937_64& rng) {
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
inline std::string first_difference(const Bytes& got, const Bytes& want, size_t element_size) {
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

// Whether the element at `at` is a NaN of the floating dtype (never, for the integer types).
inline bool is_nan(DType dtype, const std::byte* at) {
  auto bits = [&](int exponent_bits, int mantissa_bits) {
    uint64_t raw = 0;
    for (size_t b = 0; b < dtype_size(dtype); ++b) raw |= uint64_t{std::to_integer<uint8_t>(at[b])} << (8 * b);
    const uint64_t all_ones = (uint64_t{1} << exponent_bits) - 1;
    const uint64_t mantissa = raw & ((uint64_t{1} << mantissa_bits) - 1);
    return ((raw >> mantissa_bits) & all_ones) == all_ones && mantissa != 0;
  };
  switch (dtype) {
    case DType::kFloat32: return bits(8, 23);
    case DType::kFloat64: return bits(11, 52);
    case DType::kFloat16: return bits(5, 10);
    case DType::kBFloat16: return bits(8, 7);
    default: return false;
  }
}

// Like first_difference, except that two NaNs count as equal whatever their sign and payload.
// For comparing across processors: a NaN made by arithmetic (inf + -inf) is the default NaN of
// the processor that made it, which is 0xffc00000 (sign set) on x86 and 0x7fffffff on NVIDIA
// GPUs, and the half types inherit it through their conversion.
inline std::string first_difference_any_nan(const Bytes& got, const Bytes& want, DType dtype) {
  if (got.size() != want.size()) return "sizes differ";
  const size_t size = dtype_size(dtype);
  for (size_t i = 0; i + size <= got.size(); i += size) {
    if (is_nan(dtype, got.data() + i) && is_nan(dtype, want.data() + i)) continue;
    if (std::memcmp(got.data() + i, want.data() + i, size) == 0) continue;
    std::ostringstream text;
    text << "element " << i / size << " differs: bytes";
    for (size_t b = i; b < i + size; ++b) {
      text << ' ' << std::hex << std::to_integer<int>(got[b]) << '/' << std::to_integer<int>(want[b]);
    }
    text << " (got/want)";
    return text.str();
  }
  return "";
}

inline std::vector<const void*> pointers(const std::vector<Bytes>& buffers, size_t first, size_t last) {
  std::vector<const void*> result;
  for (size_t b = first; b < last; ++b) result.push_back(buffers[b].data());
  return result;
}

}  // namespace gradsync::reduce::cases
