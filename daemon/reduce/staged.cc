#include "daemon/reduce/staged.h"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "daemon/reduce/combine.h"
#include "daemon/reduce/simd.h"
#include "shared/half.h"

namespace gradsync::reduce {
namespace {



template <class Codec>
typename Codec::Acc rounded(typename Codec::Acc v, bool round_each) {
  return round_each ? Codec::load(Codec::store(v)) : v;
}

// The half types accumulate in float32, which kernel.h's reduce() cannot hand out; simd.h's
// fold() can (accumulate), and finish_half rounds; flags are template parameters so the loops
// carry no branches.
template <class Codec, bool kAfter, bool kRound>
void finish_half(const KernelArgs& args, const float* acc, std::span<void* const> outputs, size_t count) {
  using Storage = typename Codec::Storage;
  const float divisor = kAfter ? static_cast<float>(args.divisor) : 1.0f;
  constexpr size_t kBlock = kHealthBlockElements;  // one health block per staged block
  Storage staged[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t len = std::min(kBlock, count - begin);
    for (size_t i = 0; i < len; ++i) {
      const float v = acc[begin + i];
      staged[i] = Codec::store(kAfter ? rounded<Codec>(v / divisor, kRound) : v);
    }
    if (args.health) args.health[begin / kBlock] = simd::health(args.dtype, staged, len);
    for (void* out : outputs) {
      // acc is the daemon's own buffer, so no output is an input.
      if (args.stream_outputs) {
        simd::stream_copy(static_cast<Storage*>(out) + begin, staged, len * sizeof(Storage));
      } else {
        std::memcpy(static_cast<Storage*>(out) + begin, staged, len * sizeof(Storage));
      }
    }
  }
  if (args.stream_outputs) simd::stream_fence();  // before the caller publishes the results
}

template <class Codec>
void finish_half_dispatch(const KernelArgs& args, const void* acc, std::span<void* const> outputs, size_t count) {
  const auto* in = static_cast<const float*>(acc);
  const bool after = args.scale == Scale::kAfter;
  const bool round = !args.wide_accumulate;
  if (after) {
    return round ? finish_half<Codec, true, true>(args, in, outputs, count)
                 : finish_half<Codec, true, false>(args, in, outputs, count);
  }
  finish_half<Codec, false, false>(args, in, outputs, count);
}

// The engine's combine function is a plain function pointer, so each (dtype, combine,
// rounding) gets an instantiation that forwards to simd.h's vector loop.
template <DType kAcc, Combine kCombine, DType kRoundTo>
void combine_buffers(void* out, const void* a, const void* b, size_t n) {
  simd::combine_pair(simd::PairArgs{kAcc, kCombine, kRoundTo}, out, a, b, n);
}

template <DType kAcc, DType kRoundTo = kAcc>
CombinerFn pick(Combine c) {
  switch (c) {
    case Combine::kSum: return &combine_buffers<kAcc, Combine::kSum, kRoundTo>;
    case Combine::kMin: return &combine_buffers<kAcc, Combine::kMin, kRoundTo>;
    case Combine::kMax: return &combine_buffers<kAcc, Combine::kMax, kRoundTo>;
  }
  return nullptr;
}

}  // namespace

DType accumulation_dtype(DType dtype) { return dtype_is_half(dtype) ? DType::kFloat32 : dtype; }

void accumulate(const KernelArgs& args, std::span<const void* const> inputs, void* acc, size_t count) {
  if (inputs.empty() || count == 0) return;
  // The post-divide is left for finish().
  KernelArgs stage = args;
  if (stage.scale == Scale::kAfter) stage.scale = Scale::kNone;
  stage.health = nullptr;  // partial sums are not results
  // The half types accumulate in float32: simd.h's fold() hands that out. Every other dtype
  // accumulates in itself, so kernel.h's blocked reduce() is the accumulate stage (its blocks
  // also make in-place calls safe, which fold() alone is not).
  if (dtype_is_half(args.dtype)) return simd::fold(stage, inputs, 0, count, acc);
  void* const out = acc;
  reduce(stage, inputs, std::span<void* const>(&out, 1), count);
}

void finish(const KernelArgs& args, const void* acc, std::span<void* const> outputs, size_t count) {
  if (count == 0) return;
  if (args.dtype == DType::kFloat16) return finish_half_dispatch<Float16Codec>(args, acc, outputs, count);
  if (args.dtype == DType::kBFloat16) return finish_half_dispatch<BFloat16Codec>(args, acc, outputs, count);
  // A one-input reduce() is a copy, with the post-divide fused when there is one; the prescale
  // already happened in accumulate().
  KernelArgs stage = args;
  if (stage.scale == Scale::kBefore) stage.scale = Scale::kNone;
  const void* const in = acc;
  reduce(stage, std::span<const void* const>(&in, 1), outputs, count);
}

template <DType kWire, Combine kCombine>
void combine_wire_buffers(void* out, const void* a, const void* b, size_t n) {
  simd::combine_wire(kWire, kCombine, out, a, b, n);
}

template <DType kWire>
CombinerFn pick_wire(Combine c) {
  switch (c) {
    case Combine::kSum: return &combine_wire_buffers<kWire, Combine::kSum>;
    case Combine::kMin: return &combine_wire_buffers<kWire, Combine::kMin>;
    case Combine::kMax: return &combine_wire_buffers<kWire, Combine::kMax>;
  }
  return nullptr;
}

CombinerFn wire_combiner(Combine combine, DType wire) {
  return wire == DType::kFloat16 ? pick_wire<DType::kFloat16>(combine) : pick_wire<DType::kBFloat16>(combine);
}

CombinerFn combiner(const KernelArgs& args) {
  switch (args.dtype) {
    case DType::kFloat32: return pick<DType::kFloat32>(args.combine);
    case DType::kFloat64: return pick<DType::kFloat64>(args.combine);
    case DType::kFloat16:
      return args.wide_accumulate ? pick<DType::kFloat32>(args.combine) : pick<DType::kFloat32, DType::kFloat16>(args.combine);
    case DType::kBFloat16:
      return args.wide_accumulate ? pick<DType::kFloat32>(args.combine) : pick<DType::kFloat32, DType::kBFloat16>(args.combine);
    case DType::kInt32: return pick<DType::kInt32>(args.combine);
    case DType::kInt64: return pick<DType::kInt64>(args.combine);
    case DType::kUInt8: return pick<DType::kUInt8>(args.combine);
  }
  return nullptr;
}

}  // namespace gradsync::reduce
