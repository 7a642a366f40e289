#include "shared/half.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace gradsync {
namespace {

float float_from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }

bool is_half_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool is_bfloat16_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }
bool is_quiet_float_nan(float f) { return std::isnan(f) && (bits_of(f) & 0x00400000u) != 0; }

// Independent reference for narrowing: the exact value of a float is compared, in double,
// against the sorted table of the target type's non-negative finite values; the nearer
// neighbour wins and a tie goes to the even bit pattern. `decode` only has to be right on
// finite values, which the round-trip tests establish.
class NarrowingReference {
 public:
  // finite_max_bits: the largest finite positive pattern; overflow_bound: the value one ulp
  // above it (the point infinity "stands for" when rounding).
  template <typename Decode>
  NarrowingReference(Decode decode, uint16_t finite_max_bits, double overflow_bound,
                     uint16_t infinity_bits)
      : infinity_bits_(infinity_bits) {
    for (uint32_t bits = 0; bits <= finite_max_bits; ++bits) {
      values_.push_back(static_cast<double>(decode(static_cast<uint16_t>(bits))));
    }
    values_.push_back(overflow_bound);
  }

  uint16_t round(float value) const {
    const double magnitude = std::fabs(static_cast<double>(value));
    const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
    if (std::isinf(value)) return sign | infinity_bits_;
    // First table entry above the magnitude; its predecessor is the one at or below.
    const auto above = std::upper_bound(values_.begin(), values_.end(), magnitude);
    if (above == values_.end()) return sign | infinity_bits_;
    const size_t hi = static_cast<size_t>(above - values_.begin());
    const size_t lo = hi - 1;
    const double below_gap = magnitude - values_[lo];
    const double above_gap = values_[hi] - magnitude;
    size_t pick = below_gap < above_gap ? lo : hi;
    if (below_gap == above_gap) pick = (lo % 2 == 0) ? lo : hi;
    // The overflow bound's index equals the infinity pattern: rounding onto it overflows.
    return static_cast<uint16_t>(sign | pick);
  }

 private:
  std::vector<double> values_;
  uint16_t infinity_bits_;
};

// Random floats concentrated on the target's range (plus some beyond it on both sides).
std::vector<float> random_floats_near(int min_exponent, int max_exponent, size_t count) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> exponent(min_exponent, max_exponent);
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7fffff);
  std::uniform_int_distribution<uint32_t> sign(0, 1);
  std::vector<float> values;
  values.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t biased = static_cast<uint32_t>(exponent(rng) + 127);
    values.push_back(float_from_bits((sign(rng) << 31) | (biased << 23) | mantissa(rng)));
  }
  return values;
}

std::string hex(uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

TEST_CASE("float16: every non-NaN bit pattern round-trips through float exactly", "[half]") {
  std::string first_mismatch;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if (is_half_nan(h)) continue;
    const uint16_t back = float_to_half(half_to_float(h));
    if (back != h && first_mismatch.empty()) first_mismatch = hex(h) + " -> " + hex(back);
  }
  CHECK(first_mismatch == "");
}

TEST_CASE("float16: NaN patterns stay quiet NaNs of the same sign in both directions", "[half]") {
  int nan_patterns = 0;
  std::string first_failure;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    if (!is_half_nan(h)) continue;
    ++nan_patterns;
    const float wide = half_to_float(h);
    const uint16_t back = float_to_half(wide);
    const bool ok = is_quiet_float_nan(wide) && std::signbit(wide) == ((h & 0x8000u) != 0) &&
                    is_half_nan(back) && (back & 0x0200u) != 0 && (back & 0x8000u) == (h & 0x8000u);
    if (!ok && first_failure.empty()) first_failure = hex(h) + " -> " + hex(back);
  }
  CHECK(nan_patterns == 2 * 1023);
  CHECK(first_failure == "");
}

TEST_CASE("bfloat16: every non-NaN bit pattern round-trips through float exactly", "[half]") {
  std::string first_mismatch;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    if (is_bfloat16_nan(b)) continue;
    const float wide = bfloat16_to_float(b);
    const uint16_t back = float_to_bfloat16(wide);
    // Widening bfloat16 is exact: it is the top half of the float.
    if ((back != b || bits_of(wide) != bits << 16) && first_mismatch.empty()) {
      first_mismatch = hex(b) + " -> " + hex(back);
    }
  }
  CHECK(first_mismatch == "");
}

TEST_CASE("bfloat16: NaN patterns stay quiet NaNs of the same sign in both directions", "[half]") {
  int nan_patterns = 0;
  std::string first_failure;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    if (!is_bfloat16_nan(b)) continue;
    ++nan_patterns;
    const float wide = bfloat16_to_float(b);
    const uint16_t back = float_to_bfloat16(wide);
    const bool ok = is_quiet_float_nan(wide) && std::signbit(wide) == ((b & 0x8000u) != 0) &&
                    is_bfloat16_nan(back) && (back & 0x0040u) != 0 &&
                    (back & 0x8000u) == (b & 0x8000u);
    if (!ok && first_failure.empty()) first_failure = hex(b) + " -> " + hex(back);
  }
  CHECK(nan_patterns == 2 * 127);
  CHECK(first_failure == "");
}

TEST_CASE("half_to_float decodes normals, subnormals, zeros and infinities to their values",
          "[half]") {
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0xc000) == -2.0f);
  CHECK(half_to_float(0x3555) == 0x1.554p-2f);
  CHECK(half_to_float(0x7bff) == 65504.0f);
  CHECK(half_to_float(0x0400) == 0x1p-14f);
  CHECK(half_to_float(0x03ff) == 1023 * 0x1p-24f);
  CHECK(half_to_float(0x0200) == 0x1p-15f);
  CHECK(half_to_float(0x0001) == 0x1p-24f);
  CHECK(half_to_float(0x8001) == -0x1p-24f);
  CHECK(bits_of(half_to_float(0x0000)) == 0x00000000u);
  CHECK(bits_of(half_to_float(0x8000)) == 0x80000000u);
  CHECK(half_to_float(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(half_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("float_to_half rounds exact halfway values to the even neighbour", "[half]") {
  // Between 1 (0x3c00, even) and 1 + 2^-10 (0x3c01): down to even.
  CHECK(float_to_half(1.0f + 0x1p-11f) == 0x3c00);
  // Between 0x3c01 (odd) and 0x3c02 (even): up to even.
  CHECK(float_to_half(1.0f + 3 * 0x1p-11f) == 0x3c02);
  // One float ulp either side of a tie is no tie.
  CHECK(float_to_half(std::nextafter(1.0f + 0x1p-11f, 2.0f)) == 0x3c01);
  CHECK(float_to_half(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)) == 0x3c01);
  CHECK(float_to_half(-(1.0f + 0x1p-11f)) == 0xbc00);
  // A tie that carries into the exponent: 2 - 2^-11 lies between 0x3bff and 2.0 (0x4000).
  CHECK(float_to_half(2.0f - 0x1p-11f) == 0x4000);
}

TEST_CASE("float_to_half rounds into, within and out of the subnormal range", "[half]") {
  CHECK(float_to_half(0x1p-24f) == 0x0001);
  CHECK(float_to_half(0x1p-25f) == 0x0000);                            // tie with 0: even
  CHECK(float_to_half(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(float_to_half(3 * 0x1p-25f) == 0x0002);                        // tie 1|2: even
  CHECK(float_to_half(5 * 0x1p-25f) == 0x0002);                        // tie 2|3: even
  CHECK(float_to_half(1023 * 0x1p-24f) == 0x03ff);                     // largest subnormal
  CHECK(float_to_half(1023.5f * 0x1p-24f) == 0x0400);                  // tie into the normals
  CHECK(float_to_half(-0x1p-24f) == 0x8001);
  CHECK(float_to_half(0x1p-26f) == 0x0000);
  CHECK(float_to_half(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(float_to_half(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(float_to_half(-0.0f) == 0x8000);
}

TEST_CASE("float_to_half overflows to infinity from 65520, the tie above the largest half",
          "[half]") {
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);
  CHECK(float_to_half(-65520.0f) == 0xfc00);
  CHECK(float_to_half(1e10f) == 0x7c00);
  CHECK(float_to_half(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00);
}

TEST_CASE("float_to_half turns signaling and quiet NaNs into quiet half NaNs", "[half]") {
  const uint16_t from_signaling = float_to_half(float_from_bits(0x7f800001u));
  CHECK(is_half_nan(from_signaling));
  CHECK((from_signaling & 0x0200u) != 0);
  const uint16_t negative = float_to_half(float_from_bits(0xffc00000u));
  CHECK(is_half_nan(negative));
  CHECK((negative & 0x8000u) != 0);
  CHECK(is_quiet_float_nan(half_to_float(0x7c01)));
}

TEST_CASE("float_to_half matches a table-based round-to-nearest-even reference", "[half]") {
  const NarrowingReference reference(half_to_float, 0x7bff, 65536.0, 0x7c00);
  std::string first_mismatch;
  for (float value : random_floats_near(-28, 17, 400000)) {
    const uint16_t got = float_to_half(value);
    const uint16_t want = reference.round(value);
    if (got != want && first_mismatch.empty()) {
      first_mismatch = hex(bits_of(value)) + " gave " + hex(got) + ", want " + hex(want);
    }
  }
  CHECK(first_mismatch == "");
}

TEST_CASE("float_to_bfloat16 rounds exact halfway values to the even neighbour", "[half]") {
  CHECK(float_to_bfloat16(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(float_to_bfloat16(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(float_to_bfloat16(std::nextafter(1.0f + 0x1p-8f, 2.0f)) == 0x3f81);
  CHECK(float_to_bfloat16(-(1.0f + 3 * 0x1p-8f)) == 0xbf82);
}

TEST_CASE("float_to_bfloat16 rounds subnormals and overflows to infinity", "[half]") {
  CHECK(float_to_bfloat16(float_from_bits(0x00010000u)) == 0x0001);
  CHECK(float_to_bfloat16(float_from_bits(0x00008000u)) == 0x0000);  // tie with 0: even
  CHECK(float_to_bfloat16(float_from_bits(0x00018000u)) == 0x0002);  // tie 1|2: even
  CHECK(float_to_bfloat16(float_from_bits(0x00008001u)) == 0x0001);
  CHECK(float_to_bfloat16(float_from_bits(0x7f7f7fffu)) == 0x7f7f);
  CHECK(float_to_bfloat16(float_from_bits(0x7f7f8000u)) == 0x7f80);  // tie onto infinity
  CHECK(float_to_bfloat16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bfloat16(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(float_to_bfloat16(-std::numeric_limits<float>::infinity()) == 0xff80);
}

TEST_CASE("float_to_bfloat16 turns signaling and quiet NaNs into quiet bfloat16 NaNs",
          "[half]") {
  CHECK(float_to_bfloat16(float_from_bits(0x7f800001u)) == 0x7fc0);
  CHECK(float_to_bfloat16(float_from_bits(0xff800001u)) == 0xffc0);
  CHECK(float_to_bfloat16(float_from_bits(0x7fc12345u)) == 0x7fc1);
  CHECK(is_quiet_float_nan(bfloat16_to_float(0x7f81)));
}

TEST_CASE("float_to_bfloat16 matches a table-based round-to-nearest-even reference", "[half]") {
  const NarrowingReference reference(bfloat16_to_float, 0x7f7f, 0x1p128, 0x7f80);
  std::string first_mismatch;
  for (float value : random_floats_near(-127, 127, 400000)) {
    const uint16_t got = float_to_bfloat16(value);
    const uint16_t want = reference.round(value);
    if (got != want && first_mismatch.empty()) {
      first_mismatch = hex(bits_of(value)) + " gave " + hex(got) + ", want " + hex(want);
    }
  }
  CHECK(first_mismatch == "");
}

}  // namespace
}  // namespace gradsync
