// IEEE binary16 (float16) and bfloat16 conversions, done on the bit patterns so that results do
// not depend on the CPU (no F16C or AVX-512 BF16 needed) or on the floating-point environment.
//
// Contract:
//   - Narrowing (float_to_half, float_to_bfloat16) rounds to nearest, ties to even. Values at
//     or beyond the half type's overflow threshold become +-inf; values below its smallest
//     subnormal round to +-0 or to the smallest subnormal as rounding dictates; subnormals of
//     the target type are produced exactly rounded.
//   - Widening (half_to_float, bfloat16_to_float) is exact, subnormals included.
//   - Signs of zero and infinity are kept. A NaN stays a NaN, always a quiet one (the quiet bit
//     is set, the top payload bits are kept), in both directions.
//   - So every non-NaN 16-bit pattern round-trips bit for bit through float.
// Every function is branch-free: the special cases are computed alongside the common one and
// chosen with selects, so that loops over arrays can vectorize.
#pragma once

#include <bit>
#include <cstdint>

#include "shared/hd.h"

namespace gradsync {
namespace half_detail {

// condition ? if_true : if_false, written with a mask. GCC turns a plain ?: on these values
// into vector code that is several times slower (measured 0.55 vs 2-5 ns per element on
// x86-64 SSE2), and it does not if-convert a ?: whose arm holds a floating-point operation.
GRADSYNC_HD inline uint32_t select(bool condition, uint32_t if_true, uint32_t if_false) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

}  // namespace half_detail

GRADSYNC_HD inline uint16_t float_to_half(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7fffffffu;

  // Normal results: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to
  // nearest even. A carry out of the mantissa correctly bumps the exponent.
  const uint32_t rebiased = abs - ((127u - 15u) << 23);
  const uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;

  // Subnormal results (|value| < 2^-14): the result is |value| / 2^-24 rounded to an integer,
  // i.e. the significand (implicit bit made explicit) shifted right by 126 - exponent >= 14.
  // The variable part of that shift is done as four conditional fixed shifts, each folding the
  // bits it drops into bit 0 ("sticky"), so that rounding still sees them; SSE2 has no
  // per-lane variable shift, and this keeps the loop vectorizable without AVX2. Shifts of 25
  // or more all give 0, hence the clamp. Rounding up from the largest subnormal yields 0x400,
  // the smallest normal.
  const int32_t extra_shift = 112 - static_cast<int32_t>(abs >> 23);
  const uint32_t steps =
      static_cast<uint32_t>(extra_shift < 0 ? 0 : (extra_shift > 11 ? 11 : extra_shift));
  uint32_t significand = (abs & 0x007fffffu) | 0x00800000u;
  significand = (steps & 8u) ? (significand >> 8) | ((significand & 0xffu) != 0u) : significand;
  significand = (steps & 4u) ? (significand >> 4) | ((significand & 0x0fu) != 0u) : significand;
  significand = (steps & 2u) ? (significand >> 2) | ((significand & 0x03u) != 0u) : significand;
  significand = (steps & 1u) ? (significand >> 1) | (significand & 0x01u) : significand;
  const uint32_t subnormal =
      (significand + 0x1fffu + ((significand >> 14) & 1u)) >> 14;

  // 65520 (0x477ff000) is halfway between 65504, the largest half, and 65536; ties go to the
  // even neighbour, which is infinity.
  const uint32_t quiet_nan = 0x7e00u | ((abs >> 13) & 0x03ffu);
  uint32_t magnitude = abs < 0x38800000u ? subnormal : normal;
  magnitude = abs >= 0x477ff000u ? 0x7c00u : magnitude;
  magnitude = abs > 0x7f800000u ? quiet_nan : magnitude;
  return static_cast<uint16_t>(sign | magnitude);
}

GRADSYNC_HD inline float half_to_float(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t abs = value & 0x7fffu;

  const uint32_t normal = (abs << 13) + ((127u - 15u) << 23);
  // Infinity and NaN: exponent 31 maps to 255. NaNs get the quiet bit.
  const uint32_t special =
      (normal + ((127u - 15u) << 23)) | half_detail::select(abs > 0x7c00u, 0x00400000u, 0u);
  // Subnormals (and zero) are abs * 2^-24. Normalizing them with shifts takes five
  // compare-and-shift steps and made this function 5x slower; instead the integer is
  // converted to float and scaled by a power of two. Both operations are exact (abs < 2^11,
  // and the product is 0 or at least 2^-24, a normal float), so the result does not depend on
  // the rounding mode or on flush-to-zero, just like the bit manipulation around it.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(abs)) * 0x1p-24f);

  uint32_t magnitude = half_detail::select(abs < 0x0400u, subnormal, normal);
  magnitude = half_detail::select(abs >= 0x7c00u, special, magnitude);
  return std::bit_cast<float>(sign | magnitude);
}

GRADSYNC_HD inline uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // bfloat16 is the top half of a float, so rounding the low 16 bits to nearest even covers
  // normals, subnormals and overflow to infinity alike (the carry walks into the exponent).
  // No finite value carries into the sign bit: 0x7f7fffff rounds to 0x7f80.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

GRADSYNC_HD inline float bfloat16_to_float(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  const bool is_nan = (value & 0x7fffu) > 0x7f80u;
  return std::bit_cast<float>(is_nan ? bits | 0x00400000u : bits);
}

}  // namespace gradsync
