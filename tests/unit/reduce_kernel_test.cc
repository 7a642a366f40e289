#include "daemon/reduce/kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sys/mman.h>

#include <catch2/catch.hpp>

#include "shared/dtype.h"
#include "shared/half.h"
#include "tests/unit/dtype_store.h"

namespace gradsync::reduce {
namespace {

// Not a multiple of any block or vector width, so every test also crosses block boundaries
// and runs the scalar tails.
constexpr size_t kOddCount = 100003;

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt32,   DType::kInt64,
                                DType::kUInt8};
constexpr DType kFloatingDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                     DType::kBFloat16};

// `buffers` arrays of `count` elements of one dtype, written and read as double. Writing
// rounds to nearest even (floating) or converts (integer); tests choose values that are exact.
class Buffers {
 public:
  Buffers(DType dtype, size_t buffers, size_t count)
      : dtype_(dtype),
        count_(count),
        bytes_(buffers, std::vector<std::byte>(count * dtype_size(dtype))) {}

  void set(size_t buffer, size_t i, double value) {
    test::store_as(dtype_, bytes_[buffer].data() + i * dtype_size(dtype_), value);
  }

  double get(size_t buffer, size_t i) const {
    const std::byte* at = bytes_[buffer].data() + i * dtype_size(dtype_);
    switch (dtype_) {
      case DType::kFloat32: return load<float>(at);
      case DType::kFloat64: return load<double>(at);
      case DType::kFloat16: return half_to_float(load<uint16_t>(at));
      case DType::kBFloat16: return bfloat16_to_float(load<uint16_t>(at));
      case DType::kInt32: return load<int32_t>(at);
      case DType::kInt64: return static_cast<double>(load<int64_t>(at));
      case DType::kUInt8: return load<uint8_t>(at);
    }
    return 0;
  }

  void clear(size_t buffer) { std::ranges::fill(bytes_[buffer], std::byte{0}); }

  const std::vector<std::byte>& raw(size_t buffer) const { return bytes_[buffer]; }

  // Pointers to `buffers` consecutive buffers starting at `first`, offset by `element`.
  std::vector<const void*> inputs(size_t first, size_t buffers, size_t element = 0) const {
    std::vector<const void*> pointers;
    for (size_t b = first; b < first + buffers; ++b) {
      pointers.push_back(bytes_[b].data() + element * dtype_size(dtype_));
    }
    return pointers;
  }
  std::vector<void*> outputs(size_t first, size_t buffers, size_t element = 0) {
    std::vector<void*> pointers;
    for (size_t b = first; b < first + buffers; ++b) {
      pointers.push_back(bytes_[b].data() + element * dtype_size(dtype_));
    }
    return pointers;
  }

  size_t count() const { return count_; }

 private:
  template <typename T>
  static T load(const std::byte* at) {
    T value;
    std::memcpy(&value, at, sizeof(T));
    return value;
  }

  DType dtype_;
  size_t count_;
  std::vector<std::vector<std::byte>> bytes_;
};

// Values whose sums (of 4), averages by 4, minima and maxima are exact in every dtype:
// small integers for floating types (bfloat16 has 8 significant bits), wide integers for the
// integer types, kept clear of wraparound.
double exact_value(DType dtype, std::mt19937& rng) {
  switch (dtype) {
    case DType::kInt32: return std::uniform_int_distribution<int32_t>(-500000000, 500000000)(rng);
    case DType::kInt64:
      return static_cast<double>(
          std::uniform_int_distribution<int64_t>(-(1ll << 50), 1ll << 50)(rng));
    case DType::kUInt8: return std::uniform_int_distribution<int>(0, 63)(rng);
    default: return std::uniform_int_distribution<int>(-12, 12)(rng);
  }
}

// Fills buffers [0, clients) with exact values; the reference is computed in double.
Buffers exact_inputs(DType dtype, size_t clients, size_t extra_buffers, size_t count) {
  Buffers buffers(dtype, clients + extra_buffers, count);
  std::mt19937 rng(7 + static_cast<int>(dtype));
  for (size_t c = 0; c < clients; ++c) {
    for (size_t i = 0; i < count; ++i) buffers.set(c, i, exact_value(dtype, rng));
  }
  return buffers;
}

// "" when buffer `out` holds want(i) at every i, else the first difference.
template <typename Want>
std::string first_difference(const Buffers& buffers, size_t out, Want want) {
  for (size_t i = 0; i < buffers.count(); ++i) {
    const double got = buffers.get(out, i);
    const double expected = want(i);
    const bool same = got == expected || (std::isnan(got) && std::isnan(expected));
    if (!same) {
      std::ostringstream message;
      message << "element " << i << ": got " << got << ", want " << expected;
      return message.str();
    }
  }
  return "";
}

// "" when two buffers hold the same bytes, else the first differing byte (comparing the
// vectors directly would make Catch print megabytes on failure).
std::string first_byte_difference(const Buffers& buffers, size_t a, size_t b) {
  const auto& left = buffers.raw(a);
  const auto& right = buffers.raw(b);
  for (size_t i = 0; i < left.size(); ++i) {
    if (left[i] != right[i]) return "byte " + std::to_string(i) + " differs";
  }
  return "";
}

void run(const KernelArgs& args, const std::vector<const void*>& inputs,
         const std::vector<void*>& outputs, size_t count) {
  REQUIRE(validate_kernel_args(args) == "");
  reduce(args, inputs, outputs, count);
}

double half_ulp(double value, int significand_bits, int min_exponent) {
  const int exponent = value == 0 ? min_exponent : std::max(std::ilogb(value), min_exponent);
  return std::ldexp(0.5, exponent - (significand_bits - 1));
}

TEST_CASE("sum of every dtype equals the exact sum of the inputs", "[reduce]") {
  for (DType dtype : kAllDTypes) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      Buffers buffers = exact_inputs(dtype, 4, 1, kOddCount);
      KernelArgs args{.dtype = dtype, .combine = Combine::kSum};
      run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
      CHECK(first_difference(buffers, 4, [&](size_t i) {
              return buffers.get(0, i) + buffers.get(1, i) + buffers.get(2, i) + buffers.get(3, i);
            }) == "");
    }
  }
}

TEST_CASE("min and max of every dtype pick the smallest and largest input", "[reduce]") {
  for (DType dtype : kAllDTypes) {
    for (Combine combine : {Combine::kMin, Combine::kMax}) {
      DYNAMIC_SECTION(dtype_name(dtype) << (combine == Combine::kMin ? " min" : " max")) {
        Buffers buffers = exact_inputs(dtype, 4, 1, kOddCount);
        KernelArgs args{.dtype = dtype, .combine = combine};
        run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
        CHECK(first_difference(buffers, 4, [&](size_t i) {
                double best = buffers.get(0, i);
                for (size_t c = 1; c < 4; ++c) {
                  best = combine == Combine::kMin ? std::min(best, buffers.get(c, i))
                                                  : std::max(best, buffers.get(c, i));
                }
                return best;
              }) == "");
      }
    }
  }
}

TEST_CASE("average of every floating dtype equals the exact sum over 4, before or after",
          "[reduce]") {
  for (DType dtype : kFloatingDTypes) {
    for (Scale scale : {Scale::kBefore, Scale::kAfter}) {
      for (bool wide : {true, false}) {
        if (!wide && !dtype_is_half(dtype)) continue;  // only half types accumulate narrowly
        DYNAMIC_SECTION(dtype_name(dtype) << (scale == Scale::kBefore ? " before" : " after")
                                          << (wide ? " wide" : " narrow")) {
          Buffers buffers = exact_inputs(dtype, 4, 1, kOddCount);
          KernelArgs args{.dtype = dtype, .scale = scale, .divisor = 4.0, .wide_accumulate = wide};
          run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
          CHECK(first_difference(buffers, 4, [&](size_t i) {
                  return (buffers.get(0, i) + buffers.get(1, i) + buffers.get(2, i) +
                          buffers.get(3, i)) / 4;
                }) == "");
        }
      }
    }
  }
}

TEST_CASE("average by 3 divides once, correctly rounded, in the accumulation type", "[reduce]") {
  // The sums are exact, so the result must be the exact quotient rounded once to the dtype:
  // double's quotient rounded to float (and float to half) is that value, as each step keeps
  // more than twice the next one's bits. A multiply by a rounded 1/3 would miss it for some.
  for (DType dtype : kFloatingDTypes) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      Buffers buffers = exact_inputs(dtype, 4, 1, kOddCount);
      KernelArgs args{.dtype = dtype, .scale = Scale::kAfter, .divisor = 3.0};
      run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
      Buffers expected(dtype, 1, kOddCount);
      for (size_t i = 0; i < kOddCount; ++i) {
        double sum = 0;
        for (size_t c = 0; c < 4; ++c) sum += buffers.get(c, i);
        expected.set(0, i, dtype == DType::kFloat64 ? sum / 3 : static_cast<float>(sum / 3));
      }
      CHECK(first_difference(buffers, 4, [&](size_t i) { return expected.get(0, i); }) == "");
    }
  }
}

TEST_CASE("float32 division is a true divide, not a multiply by the reciprocal", "[reduce]") {
  // 7 * RN(1/3) rounds to 2.3333335 while RN(7/3) is 2.3333333.
  const float seven = 7.0f;
  REQUIRE(seven * (1.0f / 3.0f) != seven / 3.0f);
  for (Scale scale : {Scale::kBefore, Scale::kAfter}) {
    float out = 0;
    run({.dtype = DType::kFloat32, .scale = scale, .divisor = 3.0}, {&seven}, {&out}, 1);
    CHECK(out == seven / 3.0f);
  }
}

// Random halves in +-[2^-6, 8): a float32 sum of four of them is exact, so wide accumulation
// rounds exactly once.
std::vector<std::vector<uint16_t>> random_halves(DType dtype, size_t clients, size_t count) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> magnitude(0x1p-6f, 8.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<std::vector<uint16_t>> halves(clients, std::vector<uint16_t>(count));
  for (auto& buffer : halves) {
    for (auto& h : buffer) {
      const float value = negative(rng) ? -magnitude(rng) : magnitude(rng);
      h = dtype == DType::kFloat16 ? float_to_half(value) : float_to_bfloat16(value);
    }
  }
  return halves;
}

void check_half_average_within_half_ulp(DType dtype) {
  const bool fp16 = dtype == DType::kFloat16;
  const auto widen = [&](uint16_t h) { return fp16 ? half_to_float(h) : bfloat16_to_float(h); };
  const size_t count = 20000;
  auto halves = random_halves(dtype, 4, count);
  std::vector<const void*> inputs;
  for (const auto& buffer : halves) inputs.push_back(buffer.data());
  std::vector<uint16_t> wide(count);
  std::vector<uint16_t> narrow(count);
  run({.dtype = dtype, .scale = Scale::kAfter, .divisor = 4.0, .wide_accumulate = true}, inputs,
      {wide.data()}, count);
  run({.dtype = dtype, .scale = Scale::kAfter, .divisor = 4.0, .wide_accumulate = false}, inputs,
      {narrow.data()}, count);

  size_t wide_outside = 0;
  size_t narrow_outside = 0;
  size_t differing = 0;
  for (size_t i = 0; i < count; ++i) {
    double reference = 0;
    for (const auto& buffer : halves) reference += widen(buffer[i]);
    reference /= 4;
    const double limit = fp16 ? half_ulp(reference, 11, -14) : half_ulp(reference, 8, -126);
    wide_outside += std::fabs(widen(wide[i]) - reference) > limit;
    narrow_outside += std::fabs(widen(narrow[i]) - reference) > limit;
    differing += wide[i] != narrow[i];
  }
  CHECK(wide_outside == 0);
  // Rounding after every add loses accuracy on some elements, so the wide path really ran.
  CHECK(narrow_outside > 0);
  CHECK(differing > 0);
}

TEST_CASE("float16 average of 4 is within half an ulp of the float64 reference", "[reduce]") {
  check_half_average_within_half_ulp(DType::kFloat16);
}

TEST_CASE("bfloat16 average of 4 is within half an ulp of the float64 reference", "[reduce]") {
  check_half_average_within_half_ulp(DType::kBFloat16);
}

TEST_CASE("float16 narrow accumulation overflows with kAfter but stays finite with kBefore",
          "[reduce]") {
  const uint16_t big = float_to_half(40000.0f);
  REQUIRE(half_to_float(big) == 40000.0f);
  const std::vector<uint16_t> buffers(4, big);
  const std::vector<const void*> inputs = {&buffers[0], &buffers[1], &buffers[2], &buffers[3]};
  uint16_t out = 0;

  run({.dtype = DType::kFloat16, .scale = Scale::kAfter, .divisor = 4.0, .wide_accumulate = false},
      inputs, {&out}, 1);
  CHECK(std::isinf(half_to_float(out)));

  run({.dtype = DType::kFloat16, .scale = Scale::kBefore, .divisor = 4.0, .wide_accumulate = false},
      inputs, {&out}, 1);
  CHECK(half_to_float(out) == 40000.0f);

  // Accumulating in float32 avoids the overflow even when dividing after.
  run({.dtype = DType::kFloat16, .scale = Scale::kAfter, .divisor = 4.0, .wide_accumulate = true},
      inputs, {&out}, 1);
  CHECK(half_to_float(out) == 40000.0f);
}

TEST_CASE("float32 kBefore loses values that underflow when prescaled, kAfter keeps them",
          "[reduce]") {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float buffers[4] = {tiny, tiny, tiny, tiny};
  const std::vector<const void*> inputs = {&buffers[0], &buffers[1], &buffers[2], &buffers[3]};
  float out = -1;
  run({.dtype = DType::kFloat32, .scale = Scale::kBefore, .divisor = 4.0}, inputs, {&out}, 1);
  CHECK(out == 0.0f);
  run({.dtype = DType::kFloat32, .scale = Scale::kAfter, .divisor = 4.0}, inputs, {&out}, 1);
  CHECK(out == tiny);
}

TEST_CASE("inputs are combined strictly left to right", "[reduce]") {
  // In float32, (1e8 + 1) - 1e8 is 0 but (1e8 - 1e8) + 1 is 1.
  const float big = 1e8f;
  const float neg = -1e8f;
  const float one = 1.0f;
  float out = -1;
  run({.dtype = DType::kFloat32}, {&big, &one, &neg}, {&out}, 1);
  CHECK(out == 0.0f);
  run({.dtype = DType::kFloat32}, {&big, &neg, &one}, {&out}, 1);
  CHECK(out == 1.0f);
}

TEST_CASE("min and max propagate a NaN from any input", "[reduce]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float values[3] = {1.0f, nan, -1.0f};
  for (Combine combine : {Combine::kMin, Combine::kMax}) {
    for (size_t rotation = 0; rotation < 3; ++rotation) {
      const std::vector<const void*> inputs = {&values[rotation], &values[(rotation + 1) % 3],
                                               &values[(rotation + 2) % 3]};
      float out = 0;
      run({.dtype = DType::kFloat32, .combine = combine}, inputs, {&out}, 1);
      CHECK(std::isnan(out));
    }
  }
}

Buffers random_float_inputs(DType dtype, size_t clients, size_t extra_buffers, size_t count) {
  Buffers buffers(dtype, clients + extra_buffers, count);
  std::mt19937 rng(1234);
  std::lognormal_distribution<double> magnitude(0.0, 4.0);
  std::bernoulli_distribution negative(0.5);
  for (size_t c = 0; c < clients; ++c) {
    for (size_t i = 0; i < count; ++i) buffers.set(c, i, (negative(rng) ? -1 : 1) * magnitude(rng));
  }
  return buffers;
}

TEST_CASE("the same inputs give bit-identical results every time", "[reduce]") {
  for (DType dtype : kFloatingDTypes) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      Buffers buffers = random_float_inputs(dtype, 4, 2, kOddCount);
      KernelArgs args{.dtype = dtype, .scale = Scale::kAfter, .divisor = 3.0};
      run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
      run(args, buffers.inputs(0, 4), buffers.outputs(5, 1), kOddCount);
      CHECK(first_byte_difference(buffers, 4, 5) == "");
    }
  }
}

TEST_CASE("splitting the range into two calls at any boundary gives identical bits",
          "[reduce]") {
  for (DType dtype : kFloatingDTypes) {
    for (bool wide : {true, false}) {
      if (!wide && !dtype_is_half(dtype)) continue;  // only half types accumulate narrowly
      DYNAMIC_SECTION(dtype_name(dtype) << (wide ? " wide" : " narrow")) {
        Buffers buffers = random_float_inputs(dtype, 4, 2, kOddCount);
        KernelArgs args{
            .dtype = dtype, .scale = Scale::kBefore, .divisor = 3.0, .wide_accumulate = wide};
        run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
        for (size_t split : {size_t{1}, size_t{12345}, size_t{8192}, kOddCount - 7}) {
          buffers.clear(5);
          run(args, buffers.inputs(0, 4), buffers.outputs(5, 1), split);
          run(args, buffers.inputs(0, 4, split), buffers.outputs(5, 1, split), kOddCount - split);
          CHECK(first_byte_difference(buffers, 4, 5) == "");
        }
      }
    }
  }
}

TEST_CASE("in-place reduction (outputs are the inputs) is correct across block boundaries",
          "[reduce]") {
  for (DType dtype : kAllDTypes) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      // Buffer 4 keeps the expected result, computed out of place before the inputs change.
      Buffers buffers = exact_inputs(dtype, 4, 1, kOddCount);
      KernelArgs args{.dtype = dtype};
      if (dtype_is_floating(dtype)) {
        args.scale = Scale::kAfter;
        args.divisor = 4.0;
      }
      run(args, buffers.inputs(0, 4), buffers.outputs(4, 1), kOddCount);
      Buffers reference = buffers;
      run(args, buffers.inputs(0, 4), buffers.outputs(0, 4), kOddCount);
      for (size_t c = 0; c < 4; ++c) {
        CHECK(first_difference(buffers, c, [&](size_t i) {
                double sum = 0;
                for (size_t k = 0; k < 4; ++k) sum += reference.get(k, i);
                return args.scale == Scale::kAfter ? sum / 4 : sum;
              }) == "");
        CHECK(first_byte_difference(buffers, c, 4) == "");
      }
    }
  }
}

TEST_CASE("the result is written to every output, and a single input is scaled too", "[reduce]") {
  Buffers buffers = exact_inputs(DType::kFloat16, 1, 3, kOddCount);
  run({.dtype = DType::kFloat16, .scale = Scale::kAfter, .divisor = 2.0}, buffers.inputs(0, 1),
      buffers.outputs(1, 3), kOddCount);
  for (size_t out = 1; out < 4; ++out) {
    CHECK(first_difference(buffers, out, [&](size_t i) { return buffers.get(0, i) / 2; }) == "");
  }
}

// stream_outputs changes how an output that is not an input is written, never what: one
// in-place output (buffer 0, also an input) and two others, one of them at an odd element
// offset so its streaming stores start unaligned, get exactly the bytes of normal stores.
TEST_CASE("streamed outputs hold exactly the bytes of normal stores, beside an in-place one", "[reduce]") {
  for (DType dtype : kAllDTypes) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      const size_t count = kOddCount - 1;
      Buffers plain = exact_inputs(dtype, 2, 2, kOddCount);
      Buffers streamed = plain;
      KernelArgs args{.dtype = dtype};
      if (dtype_is_floating(dtype)) {
        args.scale = Scale::kAfter;
        args.divisor = 4.0;
      }
      auto outputs_of = [](Buffers& b) {
        std::vector<void*> out = b.outputs(0, 1);
        out.push_back(b.outputs(2, 1)[0]);
        out.push_back(b.outputs(3, 1, 1)[0]);
        return out;
      };
      run(args, plain.inputs(0, 2), outputs_of(plain), count);
      args.stream_outputs = true;
      run(args, streamed.inputs(0, 2), outputs_of(streamed), count);
      for (size_t b = 0; b < 4; ++b) {
        INFO("buffer " << b);
        CHECK(plain.raw(b) == streamed.raw(b));
      }
      const Buffers original = exact_inputs(dtype, 2, 0, kOddCount);
      CHECK(first_difference(streamed, 2, [&](size_t i) {
              if (i >= count) return 0.0;  // beyond the reduced range: untouched zeros
              const double sum = original.get(0, i) + original.get(1, i);
              return args.scale == Scale::kAfter ? sum / 4 : sum;
            }) == "");
    }
  }
}

// A single input that is also the only output, with nothing to scale, already holds the
// result: the kernel must not store to it at all (the cross-node fan-out of a sum, whose
// node buffer is the first rank's tensor). Read-only memory makes any store fault.
TEST_CASE("an unscaled single input that is its own output is not written", "[reduce]") {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kUInt8}) {
    const size_t bytes = 1 << 20;
    void* page = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(page != MAP_FAILED);
    std::memset(page, 0x11, bytes);
    REQUIRE(::mprotect(page, bytes, PROT_READ) == 0);
    const size_t count = bytes / dtype_size(dtype);
    for (const Combine combine : {Combine::kSum, Combine::kMin, Combine::kMax}) {
      run({.dtype = dtype, .combine = combine}, {page}, {page}, count);
    }
    CHECK(static_cast<const unsigned char*>(page)[bytes - 1] == 0x11);
    ::munmap(page, bytes);
  }
}

TEST_CASE("a zero count writes nothing", "[reduce]") {
  const float in = 1.0f;
  float out = -5.0f;
  run({.dtype = DType::kFloat32}, {&in, &in}, {&out}, 0);
  CHECK(out == -5.0f);
}

TEST_CASE("integer sums wrap modulo 2^bits", "[reduce]") {
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  const int32_t i32[] = {kMax32, 1, kMin32, -1};
  int32_t out32[2] = {};
  run({.dtype = DType::kInt32}, {&i32[0], &i32[2]}, {&out32[0]}, 2);
  CHECK(out32[0] == -1);  // max + min
  CHECK(out32[1] == 0);   // 1 + -1
  run({.dtype = DType::kInt32}, {&i32[0], &i32[1]}, {&out32[0]}, 1);
  CHECK(out32[0] == kMin32);
  run({.dtype = DType::kInt32}, {&i32[2], &i32[3]}, {&out32[0]}, 1);
  CHECK(out32[0] == kMax32);

  const int64_t i64[] = {std::numeric_limits<int64_t>::max(), 2};
  int64_t out64 = 0;
  run({.dtype = DType::kInt64}, {&i64[0], &i64[1]}, {&out64}, 1);
  CHECK(out64 == std::numeric_limits<int64_t>::min() + 1);

  const uint8_t u8[] = {200, 100, 250};
  uint8_t out8 = 0;
  run({.dtype = DType::kUInt8}, {&u8[0], &u8[1], &u8[2]}, {&out8}, 1);
  CHECK(out8 == static_cast<uint8_t>((200 + 100 + 250) % 256));
}

TEST_CASE("integer wraparound holds across a whole vectorized block", "[reduce]") {
  std::vector<uint8_t> a(kOddCount), b(kOddCount), out(kOddCount);
  for (size_t i = 0; i < kOddCount; ++i) {
    a[i] = static_cast<uint8_t>(i);
    b[i] = static_cast<uint8_t>(i * 7 + 200);
  }
  run({.dtype = DType::kUInt8}, {a.data(), b.data()}, {out.data()}, kOddCount);
  size_t wrong = 0;
  for (size_t i = 0; i < kOddCount; ++i) wrong += out[i] != static_cast<uint8_t>(a[i] + b[i]);
  CHECK(wrong == 0);
}

std::string_view validate_scaled(DType dtype, Scale scale, double divisor,
                                 Combine combine = Combine::kSum) {
  return validate_kernel_args(
      {.dtype = dtype, .combine = combine, .scale = scale, .divisor = divisor});
}

bool mentions(std::string_view message, std::string_view word) {
  return message.find(word) != std::string_view::npos;
}

TEST_CASE("validate_kernel_args accepts valid combinations", "[reduce]") {
  CHECK(validate_kernel_args({}) == "");
  CHECK(validate_kernel_args({.dtype = DType::kInt32, .combine = Combine::kMax}) == "");
  CHECK(validate_scaled(DType::kBFloat16, Scale::kBefore, 8) == "");
  CHECK(validate_scaled(DType::kFloat64, Scale::kAfter, 1e-300) == "");
  // The divisor is ignored without scaling; narrow accumulation is ignored off half types.
  CHECK(validate_kernel_args({.dtype = DType::kUInt8, .divisor = 0}) == "");
  CHECK(validate_kernel_args({.dtype = DType::kFloat32, .wide_accumulate = false}) == "");
}

TEST_CASE("validate_kernel_args rejects scaling of integer dtypes, naming the dtype", "[reduce]") {
  CHECK(validate_scaled(DType::kInt32, Scale::kAfter, 4) ==
        "scaling is not defined for int32 (use sum without a divisor)");
  CHECK(mentions(validate_scaled(DType::kUInt8, Scale::kBefore, 4), "uint8"));
  CHECK(mentions(validate_scaled(DType::kInt64, Scale::kBefore, 2), "int64"));
}

TEST_CASE("validate_kernel_args rejects scaling with min or max", "[reduce]") {
  const std::string_view message =
      validate_scaled(DType::kFloat16, Scale::kAfter, 4, Combine::kMin);
  CHECK(mentions(message, "min"));
  CHECK(mentions(message, "float16"));
  CHECK(mentions(validate_scaled(DType::kFloat64, Scale::kBefore, 2, Combine::kMax), "float64"));
}

TEST_CASE("validate_kernel_args rejects a zero, infinite, NaN or out-of-range divisor",
          "[reduce]") {
  for (double divisor : {0.0, -0.0, std::numeric_limits<double>::infinity(),
                         std::numeric_limits<double>::quiet_NaN()}) {
    const std::string_view message = validate_scaled(DType::kFloat32, Scale::kAfter, divisor);
    CHECK(mentions(message, "divisor"));
    CHECK(mentions(message, "float32"));
  }
  // Float32 accumulation cannot represent these, though float64 can.
  CHECK(mentions(validate_scaled(DType::kFloat16, Scale::kAfter, 1e-50), "divisor"));
  CHECK(mentions(validate_scaled(DType::kBFloat16, Scale::kBefore, 1e50), "divisor"));
  CHECK(validate_scaled(DType::kFloat64, Scale::kAfter, 1e50) == "");
}

TEST_CASE("validate_kernel_args rejects out-of-range enum values", "[reduce]") {
  CHECK(mentions(validate_kernel_args({.dtype = static_cast<DType>(99)}), "dtype"));
  CHECK(mentions(validate_kernel_args({.combine = static_cast<Combine>(7)}), "combine"));
  CHECK(mentions(validate_kernel_args({.scale = static_cast<Scale>(7), .divisor = 2}), "scale"));
}

}  // namespace
}  // namespace gradsync::reduce
