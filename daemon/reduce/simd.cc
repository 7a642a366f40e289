// Highway's foreach_target.h includes this file once per SIMD level (HWY_TARGET), each time
// compiling the code between the markers into namespace HWY_NAMESPACE with that level's
// instructions; the exported functions at the end pick one at run time (HWY_DYNAMIC_DISPATCH).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "daemon/reduce/simd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

#include "daemon/reduce/combine.h"
#include "daemon/reduce/simd.h"

HWY_BEFORE_NAMESPACE();
namespace gradsync::reduce::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// float16 in vectors only with exact hardware conversions: F16C (x86 AVX2 and up) or AArch64's
// fcvt. Highway's emulation (older x86 levels, EMU128) truncates instead of rounding to nearest
// even.
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR)
constexpr bool kVectorFloat16 = true;
#else
constexpr bool kVectorFloat16 = false;
#endif

// Vector loads and stores of one dtype in its accumulation type, mirroring combine.h's scalar
// codec (`Scalar`). kVector false: the dtype runs scalar on this target.
template <typename T>
struct SameLanes {
  using Scalar = SameCodec<T>;
  using D = hn::ScalableTag<T>;
  static constexpr bool kVector = true;
  static hn::Vec<D> load(D d, const T* p) { return hn::LoadU(d, p); }
  static void store(D d, hn::Vec<D> v, T* p) { hn::StoreU(v, d, p); }
  static hn::Vec<D> round(hn::Vec<D> v) { return v; }
  static hn::Vec<D> finish(hn::Vec<D> v) { return v; }
};

struct Float16Lanes {
  using Scalar = Float16Codec;
  using D = hn::ScalableTag<float>;
  using DH = hn::Rebind<hwy::float16_t, D>;
  static constexpr bool kVector = kVectorFloat16;
  static hn::Vec<D> load(D d, const uint16_t* p) {
    return hn::PromoteTo(d, hn::LoadU(DH(), reinterpret_cast<const hwy::float16_t*>(p)));
  }
  static void store(D, hn::Vec<D> v, uint16_t* p) {
    hn::StoreU(hn::DemoteTo(DH(), v), DH(), reinterpret_cast<hwy::float16_t*>(p));
  }
  static hn::Vec<D> round(hn::Vec<D> v) { return hn::PromoteTo(D(), hn::DemoteTo(DH(), v)); }
  static hn::Vec<D> finish(hn::Vec<D> v) { return v; }  // F16C's widening already quiets
};

// bfloat16 is the top half of a float32, so the conversions are shifts; Highway 1.0's own
// DemoteTo truncates, so rounding (to nearest even) and NaN quieting are spelled out as in
// shared/half.h.
struct BFloat16Lanes {
  using Scalar = BFloat16Codec;
  using D = hn::ScalableTag<float>;
  using DU = hn::RebindToUnsigned<D>;
  using DI = hn::RebindToSigned<D>;
  using DU16 = hn::Rebind<uint16_t, D>;
  static constexpr bool kVector = true;

  // Loaded NaNs keep a signaling bit pattern: every way out quiets them (arithmetic does,
  // store() and round() do, finish() does for a float32 result), giving the scalar codec's
  // bits, without the cost of quieting every element of every input.
  static hn::Vec<D> load(D d, const uint16_t* p) {
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(DU(), hn::LoadU(DU16(), p))));
  }
  static hn::Vec<D> finish(hn::Vec<D> v) { return hn::BitCast(D(), quiet_if_nan(hn::BitCast(DU(), v))); }
  static void store(D, hn::Vec<D> v, uint16_t* p) {
    hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), to_bits(v))), DU16(), p);
  }
  static hn::Vec<D> round(hn::Vec<D> v) {
    return hn::BitCast(D(), quiet_if_nan(hn::ShiftLeft<16>(to_bits(v))));
  }

 private:
  // A NaN (magnitude above infinity's bits; compared as signed, which the magnitude fits) gets
  // its quiet bit.
  static hn::Vec<DU> quiet_if_nan(hn::Vec<DU> bits) {
    const auto magnitude = hn::BitCast(DI(), hn::And(bits, hn::Set(DU(), 0x7fffffffu)));
    const auto nan = hn::RebindMask(DU(), hn::Gt(magnitude, hn::Set(DI(), 0x7f800000)));
    return hn::IfThenElse(nan, hn::Or(bits, hn::Set(DU(), 0x00400000u)), bits);
  }
  // The bfloat16 bits of v in the low 16 bits of each lane.
  static hn::Vec<DU> to_bits(hn::Vec<D> v) {
    const auto bits = hn::BitCast(DU(), v);
    const auto high = hn::ShiftRight<16>(bits);
    const auto rounded =
        hn::ShiftRight<16>(hn::Add(hn::Add(bits, hn::Set(DU(), 0x7fffu)), hn::And(high, hn::Set(DU(), 1u))));
    const auto magnitude = hn::BitCast(DI(), hn::And(bits, hn::Set(DU(), 0x7fffffffu)));
    const auto nan = hn::RebindMask(DU(), hn::Gt(magnitude, hn::Set(DI(), 0x7f800000)));
    return hn::IfThenElse(nan, hn::Or(high, hn::Set(DU(), 0x0040u)), rounded);
  }
};

// The part of the inputs one call reduces, elements [offset, offset + count) of each, and
// whether the result is stored in the accumulation type or narrowed to the dtype.
struct Span {
  std::span<const void* const> inputs;
  size_t offset;
  size_t count;
  bool narrow_out;
};

template <Combine kCombine, class V>
V combine_lanes(V acc, V value) {
  if constexpr (kCombine == Combine::kSum) {
    return hn::Add(acc, value);  // integer lanes wrap, as wrapping_add does
  } else if constexpr (!hwy::IsFloat<hn::TFromV<V>>()) {
    return kCombine == Combine::kMin ? hn::Min(acc, value) : hn::Max(acc, value);
  } else {
    // combine.h's rule: a NaN value wins, and on ties (-0 against +0) the earlier acc stays.
    // (IsNaN, not Ne(value, value): Highway's Ne is an ordered compare, false for NaNs.)
    const auto take = kCombine == Combine::kMin ? hn::Lt(value, acc) : hn::Gt(value, acc);
    return hn::IfThenElse(hn::Or(take, hn::IsNaN(value)), value, acc);
  }
}

// All inputs of one range in one pass: each vector of the result is combined in registers,
// input by input in order, and stored once. The per-element steps are the scalar kernel's, in
// lanes; the tail shorter than a vector runs the scalar steps, which do the same operations.
template <class Lanes, Combine kCombine, Scale kScale, bool kRoundEach>
class Folder {
  using Scalar = typename Lanes::Scalar;
  using Storage = typename Scalar::Storage;
  using Acc = typename Scalar::Acc;

 public:
  // Out: Acc (the accumulation type) or Storage (the result rounded to the dtype, stored as
  // narrow() would).
  template <typename Out>
  static void run(Out* HWY_RESTRICT out, std::span<const void* const> inputs, size_t offset, size_t count,
                  Acc divisor) {
    const size_t n = inputs.size();
    const auto input = [&](size_t k) { return static_cast<const Storage*>(inputs[k]) + offset; };
    size_t i = 0;
    if constexpr (Lanes::kVector) {
      const typename Lanes::D d;
      const size_t lanes = hn::Lanes(d);
      const auto div = hn::Set(d, divisor);
      for (; i + lanes <= count; i += lanes) {
        auto result = prescale(Lanes::load(d, input(0) + i), div);
        for (size_t k = 1; k < n; ++k) {
          result = round(combine_lanes<kCombine>(result, prescale(Lanes::load(d, input(k) + i), div)));
        }
        if constexpr (kScale == Scale::kAfter) result = round(hn::Div(result, div));
        if constexpr (std::is_same_v<Out, Acc>) {
          hn::StoreU(Lanes::finish(result), d, out + i);
        } else {
          Lanes::store(d, result, out + i);
        }
      }
    }
    for (; i < count; ++i) {
      Acc result = prescale_scalar(Scalar::load(input(0)[i]), divisor);
      for (size_t k = 1; k < n; ++k) {
        result = round_scalar(combine<kCombine>(result, prescale_scalar(Scalar::load(input(k)[i]), divisor)));
      }
      if constexpr (kScale == Scale::kAfter) result = round_scalar(result / divisor);
      if constexpr (std::is_same_v<Out, Acc>) {
        out[i] = result;
      } else {
        out[i] = Scalar::store(result);
      }
    }
  }

 private:
  template <class V>
  static V round(V v) {
    if constexpr (kRoundEach) return Lanes::round(v);
    return v;
  }
  template <class V>
  static V prescale(V v, V div) {
    if constexpr (kScale == Scale::kBefore) return round(hn::Div(v, div));
    return v;
  }
  static Acc round_scalar(Acc v) {
    if constexpr (kRoundEach) return Scalar::load(Scalar::store(v));
    return v;
  }
  static Acc prescale_scalar(Acc v, Acc divisor) {
    if constexpr (kScale == Scale::kBefore) return round_scalar(v / divisor);
    return v;
  }
};

// Runtime choices -> one instantiation. Integer dtypes never scale (validate_kernel_args);
// min and max never scale or round, as a pick of one input needs neither.
template <class Lanes, Combine kCombine, Scale kScale, bool kRoundEach>
void fold_pass(const Span& in, void* out, double divisor) {
  using Acc = typename Lanes::Scalar::Acc;
  using Storage = typename Lanes::Scalar::Storage;
  const Acc div = kScale == Scale::kNone ? Acc{1} : static_cast<Acc>(divisor);
  using Folder = Folder<Lanes, kCombine, kScale, kRoundEach>;
  if (in.narrow_out) return Folder::run(static_cast<Storage*>(out), in.inputs, in.offset, in.count, div);
  Folder::run(static_cast<Acc*>(out), in.inputs, in.offset, in.count, div);
}

template <class Lanes, bool kRoundEach>
void fold_floating(const KernelArgs& args, const Span& in, void* out) {
  switch (args.combine) {
    case Combine::kSum:
      switch (args.scale) {
        case Scale::kNone: return fold_pass<Lanes, Combine::kSum, Scale::kNone, kRoundEach>(in, out, 1);
        case Scale::kBefore:
          return fold_pass<Lanes, Combine::kSum, Scale::kBefore, kRoundEach>(in, out, args.divisor);
        case Scale::kAfter:
          return fold_pass<Lanes, Combine::kSum, Scale::kAfter, kRoundEach>(in, out, args.divisor);
      }
      break;
    case Combine::kMin: return fold_pass<Lanes, Combine::kMin, Scale::kNone, false>(in, out, 1);
    case Combine::kMax: return fold_pass<Lanes, Combine::kMax, Scale::kNone, false>(in, out, 1);
  }
  // validate_kernel_args() admits nothing else; writing nothing would let the kernel copy an
  // unwritten block into the outputs.
  std::abort();
}

template <class Lanes>
void fold_half(const KernelArgs& args, const Span& in, void* out) {
  if (args.wide_accumulate) return fold_floating<Lanes, false>(args, in, out);
  fold_floating<Lanes, true>(args, in, out);
}

template <typename T>
void fold_integer(const KernelArgs& args, const Span& in, void* out) {
  switch (args.combine) {
    case Combine::kSum: return fold_pass<SameLanes<T>, Combine::kSum, Scale::kNone, false>(in, out, 1);
    case Combine::kMin: return fold_pass<SameLanes<T>, Combine::kMin, Scale::kNone, false>(in, out, 1);
    case Combine::kMax: return fold_pass<SameLanes<T>, Combine::kMax, Scale::kNone, false>(in, out, 1);
  }
  std::abort();  // as in fold_floating
}

void Fold(const KernelArgs& args, std::span<const void* const> inputs, size_t offset, size_t count, void* out,
          bool narrow_out) {
  const Span in{inputs, offset, count, narrow_out};
  switch (args.dtype) {
    case DType::kFloat32: return fold_floating<SameLanes<float>, false>(args, in, out);
    case DType::kFloat64: return fold_floating<SameLanes<double>, false>(args, in, out);
    case DType::kFloat16: return fold_half<Float16Lanes>(args, in, out);
    case DType::kBFloat16: return fold_half<BFloat16Lanes>(args, in, out);
    case DType::kInt32: return fold_integer<int32_t>(args, in, out);
    case DType::kInt64: return fold_integer<int64_t>(args, in, out);
    case DType::kUInt8: return fold_integer<uint8_t>(args, in, out);
  }
  std::abort();  // as in fold_floating
}

template <class Lanes>
void narrow_half(void* out, const void* acc, size_t count) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* a = static_cast<const float*>(acc);
  size_t i = 0;
  if constexpr (Lanes::kVector) {
    const typename Lanes::D d;
    const size_t n = hn::Lanes(d);
    for (; i + n <= count; i += n) Lanes::store(d, hn::LoadU(d, a + i), o + i);
  }
  for (; i < count; ++i) o[i] = Lanes::Scalar::store(a[i]);
}

void Narrow(DType dtype, void* out, const void* acc, size_t count) {
  switch (dtype) {
    case DType::kFloat16: return narrow_half<Float16Lanes>(out, acc, count);
    case DType::kBFloat16: return narrow_half<BFloat16Lanes>(out, acc, count);
    default: std::memcpy(out, acc, count * dtype_size(dtype));
  }
}

// Round for combine_pair: nothing is rounded.
struct Unrounded {
  static constexpr bool kVector = true;
};

// out = a (+) b in the accumulation type, each result rounded through `Round` (a half type's
// lanes) or not (Unrounded). Element i is loaded from both before out[i] is stored, so out
// may alias a or b.
template <class Lanes, Combine kCombine, class Round>
void combine_pair(void* out, const void* a, const void* b, size_t count) {
  using Acc = typename Lanes::Scalar::Acc;
  auto* o = static_cast<Acc*>(out);
  const auto* x = static_cast<const Acc*>(a);
  const auto* y = static_cast<const Acc*>(b);
  size_t i = 0;
  constexpr bool kRound = !std::is_same_v<Round, Unrounded>;
  if constexpr (Round::kVector) {
    const typename Lanes::D d;
    const size_t lanes = hn::Lanes(d);
    for (; i + lanes <= count; i += lanes) {
      auto r = combine_lanes<kCombine>(hn::LoadU(d, x + i), hn::LoadU(d, y + i));
      if constexpr (kRound) r = Round::round(r);
      hn::StoreU(r, d, o + i);
    }
  }
  for (; i < count; ++i) {
    Acc r = combine<kCombine>(x[i], y[i]);
    if constexpr (kRound) r = Round::Scalar::load(Round::Scalar::store(r));
    o[i] = r;
  }
}

template <class Lanes, class Round>
void combine_pair_of(Combine combine, void* out, const void* a, const void* b, size_t count) {
  switch (combine) {
    case Combine::kSum: return combine_pair<Lanes, Combine::kSum, Round>(out, a, b, count);
    case Combine::kMin: return combine_pair<Lanes, Combine::kMin, Round>(out, a, b, count);
    case Combine::kMax: return combine_pair<Lanes, Combine::kMax, Round>(out, a, b, count);
  }
}

void CombinePair(const PairArgs& args, void* out, const void* a, const void* b, size_t count) {
  // min and max pick one of two representable values: nothing to round.
  const bool round = args.combine == Combine::kSum;
  switch (args.round_to) {
    case DType::kFloat16:
      if (round) return combine_pair_of<SameLanes<float>, Float16Lanes>(args.combine, out, a, b, count);
      break;
    case DType::kBFloat16:
      if (round) return combine_pair_of<SameLanes<float>, BFloat16Lanes>(args.combine, out, a, b, count);
      break;
    default: break;
  }
  switch (args.acc) {
    case DType::kFloat64: return combine_pair_of<SameLanes<double>, Unrounded>(args.combine, out, a, b, count);
    case DType::kInt32: return combine_pair_of<SameLanes<int32_t>, Unrounded>(args.combine, out, a, b, count);
    case DType::kInt64: return combine_pair_of<SameLanes<int64_t>, Unrounded>(args.combine, out, a, b, count);
    case DType::kUInt8: return combine_pair_of<SameLanes<uint8_t>, Unrounded>(args.combine, out, a, b, count);
    default: return combine_pair_of<SameLanes<float>, Unrounded>(args.combine, out, a, b, count);
  }
}

// Wire compression (staged.h's wire_combiner): a, b and out hold a half type; each element is
// widened to float32, combined there and rounded back, as the scalar codec does.
template <class Lanes, Combine kCombine>
void combine_wire(void* out, const void* a, const void* b, size_t count) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  if constexpr (Lanes::kVector) {
    const typename Lanes::D d;
    const size_t lanes = hn::Lanes(d);
    for (; i + lanes <= count; i += lanes) {
      Lanes::store(d, combine_lanes<kCombine>(Lanes::load(d, x + i), Lanes::load(d, y + i)), o + i);
    }
  }
  using Codec = typename Lanes::Scalar;
  for (; i < count; ++i) o[i] = Codec::store(combine<kCombine>(Codec::load(x[i]), Codec::load(y[i])));
}

template <class Lanes>
void combine_wire_of(Combine combine, void* out, const void* a, const void* b, size_t count) {
  switch (combine) {
    case Combine::kSum: return combine_wire<Lanes, Combine::kSum>(out, a, b, count);
    case Combine::kMin: return combine_wire<Lanes, Combine::kMin>(out, a, b, count);
    case Combine::kMax: return combine_wire<Lanes, Combine::kMax>(out, a, b, count);
  }
}

void CombineWire(DType wire, Combine combine, void* out, const void* a, const void* b, size_t count) {
  if (wire == DType::kFloat16) return combine_wire_of<Float16Lanes>(combine, out, a, b, count);
  combine_wire_of<BFloat16Lanes>(combine, out, a, b, count);
}

// float32 out[i] = the half type's in[i], exactly.
template <class Lanes>
void widen_half(void* out, const void* in, size_t count) {
  auto* o = static_cast<float*>(out);
  const auto* x = static_cast<const uint16_t*>(in);
  size_t i = 0;
  if constexpr (Lanes::kVector) {
    const typename Lanes::D d;
    const size_t lanes = hn::Lanes(d);
    for (; i + lanes <= count; i += lanes) hn::StoreU(Lanes::finish(Lanes::load(d, x + i)), d, o + i);
  }
  for (; i < count; ++i) o[i] = Lanes::Scalar::load(x[i]);
}

void Widen(DType dtype, void* out, const void* in, size_t count) {
  if (dtype == DType::kFloat16) return widen_half<Float16Lanes>(out, in, count);
  widen_half<BFloat16Lanes>(out, in, count);
}

void StreamCopy(void* dst, const void* src, size_t bytes) {
  const hn::ScalableTag<uint8_t> d;
  const size_t lanes = hn::Lanes(d);
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  // Plain copies up to the first aligned vector of dst and after the last one.
  const size_t head = std::min(bytes, (lanes - reinterpret_cast<uintptr_t>(out) % lanes) % lanes);
  std::memcpy(out, in, head);
  size_t i = head;
  for (; i + lanes <= bytes; i += lanes) hn::Stream(hn::LoadU(d, in + i), d, out + i);
  std::memcpy(out + i, in + i, bytes - i);
}

// health.h's sum of squares: kHealthLanes logical lanes, element i in lane i % 32, held in
// 32 / L vectors of L float64 lanes (L = 1 on the scalar level up to 8 with AVX-512), so that every
// lane sees the same elements in the same order on every level. Squares of float32 and the
// half types are exact in float64; float64 squares round once (the file is compiled without
// FMA contraction, so a multiply and an add stay two roundings everywhere).
//
// Squares are never negative, so the sum is an inf or a NaN exactly when some square is: for
// float32 and the half types that is an element that is one (their largest square is far
// inside float64's range), so no separate check runs. Only a float64 block whose sum is not
// finite is looked at again, element by element, since a finite float64 above 1e154 squares to
// an inf.
// One step of the loop: the next kHealthLanes elements into the sums, vector k taking
// elements [k * L, (k + 1) * L); the vector count is a constant, so the sums stay in registers.
// kWideSquares (float64): the square rounds, so a multiply and an add, two roundings. Otherwise
// (float32 and the half types) the square is exact in float64, so a fused multiply-add rounds
// exactly as the add alone would: the same bits, and on Zen 4 twice the speed, since the adds
// then leave the ports the float32 -> float64 conversions need to the FMA ports.
template <bool kWideSquares, class D, class Load>
HWY_INLINE hn::Vec<D> add_square(D d, const Load& load, size_t at, hn::Vec<D> sum) {
  const hn::Vec<D> x = load(d, at);
  if constexpr (kWideSquares) {
    return hn::Add(sum, hn::Mul(x, x));
  } else {
    return hn::MulAdd(x, x, sum);
  }
}

template <bool kWideSquares, class D, class Load, size_t... K>
HWY_INLINE void add_squares(D d, const Load& load, size_t at, hn::Vec<D>* sums, std::index_sequence<K...>) {
  constexpr size_t kStep = hn::MaxLanes(D());
  ((sums[K] = add_square<kWideSquares>(d, load, at + K * kStep, sums[K])), ...);
}

template <bool wide_squares, class Load>
HealthBlock health_loop(const Load& load, size_t count) {
  constexpr size_t kLanes = kHealthLanes;
  const hn::CappedTag<double, 8> d;
  constexpr size_t kVectorLanes = hn::MaxLanes(hn::CappedTag<double, 8>());
  static_assert(kLanes % kVectorLanes == 0);
  constexpr size_t kVectors = kLanes / kVectorLanes;  // 4 (AVX-512) to 32 (scalar)
  // The step is a constant; on every fixed-width level the vector is exactly that wide (a
  // scalable one narrower than its maximum would skip elements).
  if (hn::Lanes(d) != kVectorLanes) std::abort();
  using V = hn::Vec<decltype(d)>;
  V sums[kVectors];
  for (size_t k = 0; k < kVectors; ++k) sums[k] = hn::Zero(d);
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) add_squares<wide_squares>(d, load, i, sums, std::make_index_sequence<kVectors>());
  alignas(64) double lane[kLanes];
  for (size_t k = 0; k < kVectors; ++k) hn::Store(sums[k], d, lane + k * kVectorLanes);
  const hn::CappedTag<double, 1> one;
  for (; i < count; ++i) {
    const double x = hn::GetLane(load(one, i));
    lane[i % kLanes] = lane[i % kLanes] + x * x;
  }
  HealthBlock block;
  for (size_t j = 0; j < kLanes; ++j) block.sum_sq = block.sum_sq + lane[j];
  if (!std::isfinite(block.sum_sq)) {
    block.nonfinite = 1;
    if constexpr (wide_squares) {
      block.nonfinite = 0;
      for (size_t e = 0; e < count && !block.nonfinite; ++e) {
        block.nonfinite = std::isfinite(hn::GetLane(load(one, e))) ? 0 : 1;
      }
    }
  }
  return block;
}

HealthBlock Health(DType dtype, const void* data, size_t count) {
  switch (dtype) {
    case DType::kFloat64: {
      const auto* p = static_cast<const double*>(data);
      return health_loop<true>([p](auto d, size_t at) { return hn::LoadU(d, p + at); }, count);
    }
    case DType::kFloat32: {
      const auto* p = static_cast<const float*>(data);
      return health_loop<false>(
          [p](auto d, size_t at) { return hn::PromoteTo(d, hn::LoadU(hn::Rebind<float, decltype(d)>(), p + at)); }, count);
    }
    case DType::kBFloat16: {
      const auto* p = static_cast<const uint16_t*>(data);
      return health_loop<false>(
          [p](auto d, size_t at) {
            const hn::Rebind<uint32_t, decltype(d)> du;
            const hn::Rebind<float, decltype(d)> df;
            const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint16_t, decltype(d)>(), p + at)));
            return hn::PromoteTo(d, hn::BitCast(df, bits));
          },
          count);
    }
    case DType::kFloat16: {
      const auto* p = static_cast<const uint16_t*>(data);
      return health_loop<false>(
          [p](auto d, size_t at) {
            // Widening is exact, so the scalar conversion gives the same value as F16C.
            alignas(64) double widened[8];  // at most 8 lanes (CappedTag)
            for (size_t l = 0; l < hn::Lanes(d); ++l) widened[l] = half_to_float(p[at + l]);
            return hn::LoadU(d, widened);
          },
          count);
    }
    default: return HealthBlock{};
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace gradsync::reduce::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradsync::reduce::simd {

HWY_EXPORT(Fold);
HWY_EXPORT(Narrow);
HWY_EXPORT(TargetName);
HWY_EXPORT(CombinePair);
HWY_EXPORT(StreamCopy);
HWY_EXPORT(Health);
HWY_EXPORT(CombineWire);
HWY_EXPORT(Widen);

void stream_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  HWY_DYNAMIC_DISPATCH(StreamCopy)(dst, src, bytes);
}

void stream_fence() { hwy::FlushStream(); }

void combine_pair(const PairArgs& args, void* out, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  HWY_DYNAMIC_DISPATCH(CombinePair)(args, out, a, b, count);
}

void fold(const KernelArgs& args, std::span<const void* const> inputs, size_t offset, size_t count, void* acc) {
  if (count == 0 || inputs.empty()) return;
  HWY_DYNAMIC_DISPATCH(Fold)(args, inputs, offset, count, acc, false);
}

void fold_narrow(const KernelArgs& args, std::span<const void* const> inputs, size_t offset, size_t count,
                 void* out) {
  if (count == 0 || inputs.empty()) return;
  HWY_DYNAMIC_DISPATCH(Fold)(args, inputs, offset, count, out, true);
}

void narrow(DType dtype, void* out, const void* acc, size_t count) {
  if (count == 0) return;
  HWY_DYNAMIC_DISPATCH(Narrow)(dtype, out, acc, count);
}

void combine_wire(DType wire, Combine combine, void* out, const void* a, const void* b, size_t count) {
  HWY_DYNAMIC_DISPATCH(CombineWire)(wire, combine, out, a, b, count);
}

void widen(DType dtype, void* out, const void* in, size_t count) { HWY_DYNAMIC_DISPATCH(Widen)(dtype, out, in, count); }

HealthBlock health(DType dtype, const void* block, size_t count) {
  return HWY_DYNAMIC_DISPATCH(Health)(dtype, block, count);
}

const char* target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

std::vector<int64_t> supported_targets() { return hwy::SupportedAndGeneratedTargets(); }

void pin_target_for_test(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

}  // namespace gradsync::reduce::simd
#endif  // HWY_ONCE
