// The SIMD loops (daemon/reduce/simd.cc) against an element-by-element reference built from
// combine.h's scalar codecs, on every SIMD level this CPU supports: random bit patterns, so
// NaNs, infinities, subnormals and signed zeros all occur, and counts that leave scalar tails.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "daemon/reduce/combine.h"
#include "daemon/reduce/kernel.h"
#include "daemon/reduce/simd.h"
#include "shared/dtype.h"

namespace gradsync::reduce {
namespace {

// The kernel's contract, one element at a time: combine.h's codecs, in input order.
template <typename Codec>
typename Codec::Storage reference(const KernelArgs& args, const std::vector<typename Codec::Storage>& column) {
  using Acc = typename Codec::Acc;
  const bool round_each = !args.wide_accumulate && !std::is_same_v<Acc, typename Codec::Storage> &&
                          args.combine == Combine::kSum;
  const auto round = [&](Acc v) { return round_each ? Codec::load(Codec::store(v)) : v; };
  const Acc divisor = args.scale == Scale::kNone ? Acc{1} : static_cast<Acc>(args.divisor);
  Acc acc{};
  for (size_t k = 0; k < column.size(); ++k) {
    Acc value = Codec::load(column[k]);
    if (args.scale == Scale::kBefore) value = round(value / divisor);
    if (k > 0) {
      switch (args.combine) {
        case Combine::kSum: value = round(combine<Combine::kSum>(acc, value)); break;
        case Combine::kMin: value = combine<Combine::kMin>(acc, value); break;
        case Combine::kMax: value = combine<Combine::kMax>(acc, value); break;
      }
    }
    if (k + 1 == column.size() && args.scale == Scale::kAfter) value = round(value / divisor);
    acc = value;
  }
  return Codec::store(acc);
}

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  return false;
}

// The quiet bit of a NaN's bit pattern: the top significand bit of `dtype`.
bool quiet(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kFloat32: return bits & (1u << 22);
    case DType::kFloat64: return bits & (1ull << 51);
    case DType::kFloat16: return bits & (1u << 9);
    case DType::kBFloat16: return bits & (1u << 6);
    default: return true;
  }
}

template <typename Storage>
uint64_t bits_of(Storage v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(Storage));
  return bits;
}

// Random bits for every input; for the floating types a share of them replaced by special
// values so every rule is exercised. Then reduce() and compare element by element with the
// reference. Two NaNs count as equal: which operand's payload an add keeps is not part of
// the contract (the compiler may commute a scalar add).
template <typename Codec>
void check(const KernelArgs& args, size_t inputs, size_t count, uint32_t seed) {
  using Storage = typename Codec::Storage;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<Storage>> in(inputs, std::vector<Storage>(count));
  for (auto& buffer : in) {
    for (auto& v : buffer) {
      const uint64_t bits = rng();
      std::memcpy(&v, &bits, sizeof(Storage));
    }
  }
  std::vector<Storage> out(count);
  std::vector<const void*> in_ptrs;
  for (const auto& buffer : in) in_ptrs.push_back(buffer.data());
  void* const out_ptr = out.data();
  REQUIRE(validate_kernel_args(args) == "");
  reduce(args, in_ptrs, std::span<void* const>(&out_ptr, 1), count);
  for (size_t i = 0; i < count; ++i) {
    std::vector<Storage> column;
    for (const auto& buffer : in) column.push_back(buffer[i]);
    const Storage want = reference<Codec>(args, column);
    const Storage got = out[i];
    // Two NaNs may differ in payload, never in being quiet.
    const bool both_nan = is_nan(Codec::load(want)) && is_nan(Codec::load(got)) && quiet(args.dtype, bits_of(got));
    if (std::memcmp(&want, &got, sizeof(Storage)) != 0 && !both_nan) {
      FAIL("dtype " << dtype_name(args.dtype) << ", combine " << static_cast<int>(args.combine) << ", scale "
                    << static_cast<int>(args.scale) << ", wide " << args.wide_accumulate << ", target "
                    << simd::target_name() << ": element " << i << " differs from the scalar reference");
    }
  }
}

template <typename Codec>
void check_all_modes(DType dtype, bool floating) {
  const Combine combines[] = {Combine::kSum, Combine::kMin, Combine::kMax};
  uint32_t seed = 1;
  for (const Combine combine : combines) {
    const Scale scales[] = {Scale::kNone, Scale::kBefore, Scale::kAfter};
    for (const Scale scale : scales) {
      if (scale != Scale::kNone && (!floating || combine != Combine::kSum)) continue;
      for (const bool wide : {true, false}) {
        KernelArgs args{dtype, combine, scale, 3.0, wide};
        for (const size_t inputs : {size_t{1}, size_t{2}, size_t{5}}) check<Codec>(args, inputs, 9001, seed++);
      }
    }
  }
}

TEST_CASE("every SIMD level gives the scalar reference's bits for every dtype and mode", "[reduce][simd]") {
  const std::vector<int64_t> targets = simd::supported_targets();
  REQUIRE(!targets.empty());
  for (const int64_t target : targets) {
    simd::pin_target_for_test(target);
    INFO("target " << simd::target_name());
    check_all_modes<SameCodec<float>>(DType::kFloat32, true);
    check_all_modes<SameCodec<double>>(DType::kFloat64, true);
    check_all_modes<Float16Codec>(DType::kFloat16, true);
    check_all_modes<BFloat16Codec>(DType::kBFloat16, true);
    check_all_modes<SameCodec<int32_t>>(DType::kInt32, false);
    check_all_modes<SameCodec<int64_t>>(DType::kInt64, false);
    check_all_modes<SameCodec<uint8_t>>(DType::kUInt8, false);
  }
  simd::pin_target_for_test(0);
}

TEST_CASE("every SIMD level narrows every float32 bit pattern class as the scalar codecs do", "[reduce][simd]") {
  // Every 2^13th float32 pattern plus the neighbours of the half types' rounding boundaries:
  // all exponents, signs, NaN payloads and ties.
  std::vector<float> acc;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 0x1fff) {
    float f;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    acc.push_back(f);
  }
  for (const auto dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const int64_t target : simd::supported_targets()) {
      simd::pin_target_for_test(target);
      std::vector<uint16_t> out(acc.size());
      simd::narrow(dtype, out.data(), acc.data(), acc.size());
      for (size_t i = 0; i < acc.size(); ++i) {
        const uint16_t want = dtype == DType::kFloat16 ? Float16Codec::store(acc[i]) : BFloat16Codec::store(acc[i]);
        if (out[i] != want) {
          FAIL(dtype_name(dtype) << " on " << simd::target_name() << ": float bits " << std::hex
                                 << std::bit_cast<uint32_t>(acc[i]) << " gave " << out[i] << ", want " << want);
        }
      }
    }
  }
  simd::pin_target_for_test(0);
}

TEST_CASE("every SIMD level folds half inputs into float32 as the scalar codecs do, NaNs quiet", "[reduce][simd]") {
  std::mt19937_64 rng(11);
  constexpr size_t kCount = 4099;
  std::vector<std::vector<uint16_t>> in(3, std::vector<uint16_t>(kCount));
  for (auto& buffer : in) {
    for (auto& v : buffer) v = static_cast<uint16_t>(rng());
  }
  const std::vector<const void*> pointers = {in[0].data(), in[1].data(), in[2].data()};
  for (const auto dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const Combine combine : {Combine::kSum, Combine::kMin, Combine::kMax}) {
      for (const size_t inputs : {size_t{1}, size_t{3}}) {
        for (const int64_t target : simd::supported_targets()) {
          simd::pin_target_for_test(target);
          const KernelArgs args{dtype, combine, Scale::kNone, 1.0, true};
          std::vector<float> got(kCount);
          simd::fold(args, std::span<const void* const>(pointers.data(), inputs), 0, kCount, got.data());
          for (size_t i = 0; i < kCount; ++i) {
            std::vector<uint16_t> column;
            for (size_t k = 0; k < inputs; ++k) column.push_back(in[k][i]);
            // The reference in float32: the codec's loads and combine, in order.
            const auto load = [&](uint16_t v) { return dtype == DType::kFloat16 ? Float16Codec::load(v) : BFloat16Codec::load(v); };
            float want = load(column[0]);
            for (size_t k = 1; k < column.size(); ++k) {
              const float v = load(column[k]);
              want = combine == Combine::kSum ? want + v
                     : combine == Combine::kMin ? reduce::combine<Combine::kMin>(want, v)
                                                : reduce::combine<Combine::kMax>(want, v);
            }
            const uint32_t want_bits = std::bit_cast<uint32_t>(want), got_bits = std::bit_cast<uint32_t>(got[i]);
            const bool nan = std::isnan(want) && std::isnan(got[i]);
            if (nan ? (got_bits & 0x00400000u) == 0 : want_bits != got_bits) {
              FAIL(dtype_name(dtype) << " on " << simd::target_name() << ", combine " << static_cast<int>(combine)
                                     << ", " << inputs << " inputs: element " << i << " got bits " << std::hex
                                     << got_bits << ", want " << want_bits);
            }
          }
        }
      }
    }
  }
  simd::pin_target_for_test(0);
}

// combine_pair against combine.h on random bits, in place (out aliases a) as Gloo calls it.
template <typename Acc, typename RoundCodec = void>
void check_pair(DType acc, DType round_to) {
  std::mt19937_64 rng(static_cast<uint64_t>(acc) * 31 + static_cast<uint64_t>(round_to));
  constexpr size_t kCount = 1037;
  for (const Combine combine : {Combine::kSum, Combine::kMin, Combine::kMax}) {
    std::vector<Acc> a(kCount), b(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      uint64_t bits[2] = {rng(), rng()};
      std::memcpy(&a[i], &bits[0], sizeof(Acc));
      std::memcpy(&b[i], &bits[1], sizeof(Acc));
    }
    std::vector<Acc> want(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      Acc r = combine == Combine::kSum ? reduce::combine<Combine::kSum>(a[i], b[i])
              : combine == Combine::kMin ? reduce::combine<Combine::kMin>(a[i], b[i])
                                         : reduce::combine<Combine::kMax>(a[i], b[i]);
      if constexpr (!std::is_void_v<RoundCodec>) {
        if (combine == Combine::kSum) r = RoundCodec::load(RoundCodec::store(r));
      }
      want[i] = r;
    }
    simd::combine_pair(simd::PairArgs{acc, combine, round_to}, a.data(), a.data(), b.data(), kCount);
    for (size_t i = 0; i < kCount; ++i) {
      const bool both_nan = is_nan(want[i]) && is_nan(a[i]) && quiet(acc, bits_of(a[i]));
      if (std::memcmp(&want[i], &a[i], sizeof(Acc)) != 0 && !both_nan) {
        FAIL("combine_pair " << dtype_name(acc) << " rounded to " << dtype_name(round_to) << ", combine "
                             << static_cast<int>(combine) << " on " << simd::target_name() << ": element " << i);
      }
    }
  }
}

TEST_CASE("every SIMD level's cross-node combine matches the scalar combine, in place", "[reduce][simd]") {
  for (const int64_t target : simd::supported_targets()) {
    simd::pin_target_for_test(target);
    check_pair<float>(DType::kFloat32, DType::kFloat32);
    check_pair<double>(DType::kFloat64, DType::kFloat64);
    check_pair<int32_t>(DType::kInt32, DType::kInt32);
    check_pair<int64_t>(DType::kInt64, DType::kInt64);
    check_pair<uint8_t>(DType::kUInt8, DType::kUInt8);
    check_pair<float, Float16Codec>(DType::kFloat32, DType::kFloat16);
    check_pair<float, BFloat16Codec>(DType::kFloat32, DType::kBFloat16);
  }
  simd::pin_target_for_test(0);
}

// stream_copy writes the vector-aligned middle with streaming stores and the ends with memcpy:
// every start alignment and every length around a vector's width must copy exactly the bytes
// asked for, and not one byte before or after.
TEST_CASE("every SIMD level's stream_copy copies exactly, at every alignment and length", "[reduce][simd]") {
  std::vector<uint8_t> source(4096 + 256);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  for (const int64_t target : simd::supported_targets()) {
    simd::pin_target_for_test(target);
    for (size_t offset = 0; offset < 64; offset += 3) {
      for (const size_t length : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{64}, size_t{95},
                                  size_t{1000}, size_t{4096}}) {
        std::vector<uint8_t> out(source.size() + 128, 0xee);
        simd::stream_copy(out.data() + 64 + offset, source.data() + offset, length);
        simd::stream_fence();
        for (size_t i = 0; i < out.size(); ++i) {
          const bool inside = i >= 64 + offset && i < 64 + offset + length;
          const uint8_t want = inside ? source[i - 64] : uint8_t{0xee};
          if (out[i] != want) {
            FAIL("target " << simd::target_name() << ", offset " << offset << ", length " << length << ": byte "
                           << i << (inside ? " was not copied" : " outside the copy was written"));
          }
        }
      }
    }
  }
  simd::pin_target_for_test(0);
}

}  // namespace
}  // namespace gradsync::reduce
