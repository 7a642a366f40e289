#include "daemon/reduce/staged.h"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "shared/half.h"

namespace gradsync::reduce {
namespace {

template <class T>
struct Plain {
  using Storage = T;
  using Acc = T;
  static Acc load(Storage v) { return v; }
  static Storage store(Acc v) { return v; }
};
struct Half {
  using Storage = uint16_t;
  using Acc = float;
  static Acc load(Storage v) { return half_to_float(v); }
  static Storage store(Acc v) { return float_to_half(v); }
};
struct BFloat {
  using Storage = uint16_t;
  using Acc = float;
  static Acc load(Storage v) { return bfloat16_to_float(v); }
  static Storage store(Acc v) { return float_to_bfloat16(v); }
};

// Same semantics as kernel.cc: integer sums wrap, min/max propagate NaN and keep the earlier
// value on ties.
template <class Acc>
Acc combine(Combine c, Acc acc, Acc value) {
  switch (c) {
    case Combine::kSum:
      if constexpr (std::is_integral_v<Acc>) {
        using U = std::make_unsigned_t<Acc>;
        return static_cast<Acc>(static_cast<U>(static_cast<U>(acc) + static_cast<U>(value)));
      } else {
        return acc + value;
      }
    case Combine::kMin: return (value < acc || value != value) ? value : acc;
    case Combine::kMax: return (value > acc || value != value) ? value : acc;
  }
  return acc;
}

template <class Codec>
typename Codec::Acc rounded(typename Codec::Acc v, bool round_each) {
  return round_each ? Codec::load(Codec::store(v)) : v;
}

template <class Codec>
void accumulate_typed(const KernelArgs& args, std::span<const void* const> inputs, void* acc_out, size_t count) {
  using Acc = typename Codec::Acc;
  using Storage = typename Codec::Storage;
  const bool round_each = !std::is_same_v<Acc, Storage> && !args.wide_accumulate;
  const bool before = args.scale == Scale::kBefore;
  const Acc divisor = before ? static_cast<Acc>(args.divisor) : Acc{1};
  auto* acc = static_cast<Acc*>(acc_out);
  auto value = [&](size_t k, size_t i) {
    const Acc v = Codec::load(static_cast<const Storage*>(inputs[k])[i]);
    return before ? rounded<Codec>(v / divisor, round_each) : v;
  };
  for (size_t i = 0; i < count; ++i) acc[i] = value(0, i);
  for (size_t k = 1; k < inputs.size(); ++k) {
    for (size_t i = 0; i < count; ++i) acc[i] = rounded<Codec>(combine(args.combine, acc[i], value(k, i)), round_each);
  }
}

template <class Codec>
void finish_typed(const KernelArgs& args, const void* acc_in, std::span<void* const> outputs, size_t count) {
  using Acc = typename Codec::Acc;
  using Storage = typename Codec::Storage;
  const bool round_each = !std::is_same_v<Acc, Storage> && !args.wide_accumulate;
  const bool after = args.scale == Scale::kAfter;
  const Acc divisor = after ? static_cast<Acc>(args.divisor) : Acc{1};
  const auto* acc = static_cast<const Acc*>(acc_in);
  std::vector<Storage> staged(count);
  for (size_t i = 0; i < count; ++i) {
    staged[i] = Codec::store(after ? rounded<Codec>(acc[i] / divisor, round_each) : acc[i]);
  }
  for (void* out : outputs) std::memcpy(out, staged.data(), count * sizeof(Storage));
}

template <class Acc, Combine kCombine, class RoundCodec>
void combine_buffers(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<Acc*>(out);
  const auto* x = static_cast<const Acc*>(a);
  const auto* y = static_cast<const Acc*>(b);
  for (size_t i = 0; i < n; ++i) {
    Acc v = combine(kCombine, x[i], y[i]);
    if constexpr (!std::is_void_v<RoundCodec>) v = RoundCodec::load(RoundCodec::store(v));
    o[i] = v;
  }
}

template <class Acc, class RoundCodec = void>
CombinerFn pick(Combine c) {
  switch (c) {
    case Combine::kSum: return &combine_buffers<Acc, Combine::kSum, RoundCodec>;
    case Combine::kMin: return &combine_buffers<Acc, Combine::kMin, RoundCodec>;
    case Combine::kMax: return &combine_buffers<Acc, Combine::kMax, RoundCodec>;
  }
  return nullptr;
}

template <class Fn>
void with_codec(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(Plain<float>{});
    case DType::kFloat64: return fn(Plain<double>{});
    case DType::kFloat16: return fn(Half{});
    case DType::kBFloat16: return fn(BFloat{});
    case DType::kInt32: return fn(Plain<int32_t>{});
    case DType::kInt64: return fn(Plain<int64_t>{});
    case DType::kUInt8: return fn(Plain<uint8_t>{});
  }
}

}  // namespace

DType accumulation_dtype(DType dtype) { return dtype_is_half(dtype) ? DType::kFloat32 : dtype; }

void accumulate(const KernelArgs& args, std::span<const void* const> inputs, void* acc, size_t count) {
  if (inputs.empty() || count == 0) return;
  with_codec(args.dtype, [&](auto codec) { accumulate_typed<decltype(codec)>(args, inputs, acc, count); });
}

void finish(const KernelArgs& args, const void* acc, std::span<void* const> outputs, size_t count) {
  if (count == 0) return;
  with_codec(args.dtype, [&](auto codec) { finish_typed<decltype(codec)>(args, acc, outputs, count); });
}

CombinerFn combiner(const KernelArgs& args) {
  switch (args.dtype) {
    case DType::kFloat32: return pick<float>(args.combine);
    case DType::kFloat64: return pick<double>(args.combine);
    case DType::kFloat16: return args.wide_accumulate ? pick<float>(args.combine) : pick<float, Half>(args.combine);
    case DType::kBFloat16: return args.wide_accumulate ? pick<float>(args.combine) : pick<float, BFloat>(args.combine);
    case DType::kInt32: return pick<int32_t>(args.combine);
    case DType::kInt64: return pick<int64_t>(args.combine);
    case DType::kUInt8: return pick<uint8_t>(args.combine);
  }
  return nullptr;
}

}  // namespace gradsync::reduce
