#include "daemon/reduce/kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "daemon/reduce/combine.h"
#include "shared/half.h"

namespace gradsync::reduce {
namespace {

// Elements are reduced in blocks whose accumulator stays in L1: every input's block is read
// before any output's block is written, which is what makes in-place (aliased) calls correct,
// and the accumulator is written out with memcpy at full store bandwidth.
constexpr size_t kBlockBytes = 32 << 10;

// CPUs predict whether a load depends on an earlier store from the address bits below 4 KiB
// only. When the accumulator sits a few bytes below an input modulo 4 KiB, the input loads
// are falsely held behind the accumulator stores ("4K aliasing"): measured, an accumulator
// 16 bytes below the inputs made the float32 kernel 5x slower. Stack addresses are
// randomized, so a plain stack array hit that in about 1 run in 30. The accumulator is
// therefore placed relative to the buffers: kPage bytes of slack, and a start that is never
// within kAliasWindow bytes below any input or output.
constexpr uintptr_t kPage = 4096;
constexpr uintptr_t kAliasWindow = 256;

// Picks the accumulator's start inside `storage` (the accumulator's size plus kPage bytes,
// 64-byte aligned): level with the first input, rounded up to a cache line, then moved on by
// kAliasWindow while it would sit just below some buffer. Every block advances all buffers by
// a multiple of kPage, so one placement serves the whole call.
std::byte* place_accumulator(std::byte* storage, std::span<const void* const> inputs,
                             std::span<void* const> outputs) {
  const auto page_offset = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kPage; };
  const auto collides = [&](uintptr_t start) {
    // (buffer - start) mod kPage in [1, kAliasWindow]; 0 (level) is harmless.
    const auto just_below = [&](const void* p) {
      return ((page_offset(p) - start) % kPage) - 1 < kAliasWindow;
    };
    return std::any_of(inputs.begin(), inputs.end(), just_below) ||
           std::any_of(outputs.begin(), outputs.end(), just_below);
  };
  uintptr_t start = (page_offset(inputs[0]) + 63) / 64 * 64 % kPage;
  for (uintptr_t tried = 0; tried < kPage && collides(start); tried += kAliasWindow) {
    start = (start + kAliasWindow) % kPage;
  }
  return storage + (start - reinterpret_cast<uintptr_t>(storage)) % kPage;
}


// One instantiation per (dtype, combine, scale, rounding) so that the inner loops carry no
// switch and compile to straight vector code. kRoundEach is the narrow half path: the float32
// intermediate is rounded back to the half type after every operation. Because float32 has
// more than 2*11+2 significand bits, a float32 add or divide followed by that rounding gives
// exactly the correctly rounded half-precision result, so this is true half arithmetic.
template <typename Codec, Combine kCombine, Scale kScale, bool kRoundEach>
class BlockReducer {
 public:
  using Storage = typename Codec::Storage;
  using Acc = typename Codec::Acc;
  static constexpr size_t kBlock = kBlockBytes / sizeof(Acc);
  // Elements per fixed-length inner loop: a whole number of vectors at every width up to
  // 512 bits, even for uint8.
  static constexpr size_t kChunk = 64;

  // Integer reducers never scale; converting an arbitrary double to an integer would be UB.
  explicit BlockReducer(double divisor)
      : divisor_(kScale == Scale::kNone ? Acc{1} : static_cast<Acc>(divisor)) {}

  void run(std::span<const void* const> inputs, std::span<void* const> outputs,
           size_t count) const {
    static_assert(kBlock * sizeof(Storage) % kPage == 0);
    // 36 KiB of stack (plus a 16 KiB staging block for the half types): no allocation per call.
    alignas(64) std::byte storage[kBlock * sizeof(Acc) + kPage];
    Acc* acc = reinterpret_cast<Acc*>(place_accumulator(storage, inputs, outputs));
    for (size_t begin = 0; begin < count; begin += kBlock) {
      const size_t len = std::min(kBlock, count - begin);
      reduce_block(acc, inputs, outputs, begin, len);
    }
  }

 private:
  static Acc round_to_storage(Acc value) {
    if constexpr (kRoundEach) {
      return Codec::load(Codec::store(value));
    } else {
      return value;
    }
  }

  // Division is a true divide (not a multiply by the reciprocal) so that, e.g., x / 3 is
  // correctly rounded.
  static Acc prescale(Acc value, Acc divisor) {
    if constexpr (kScale == Scale::kBefore) {
      return round_to_storage(value / divisor);
    } else {
      return value;
    }
  }

  static Acc postscale(Acc value, Acc divisor) {
    if constexpr (kScale == Scale::kAfter) {
      return round_to_storage(value / divisor);
    } else {
      return value;
    }
  }

  template <bool kFirst, bool kLast>
  static void step(Acc* __restrict acc, const Storage* __restrict in, size_t i, Acc divisor) {
    const Acc value = prescale(Codec::load(in[i]), divisor);
    Acc result;
    if constexpr (kFirst) {
      result = value;
    } else {
      result = round_to_storage(combine<kCombine>(acc[i], value));
    }
    acc[i] = kLast ? postscale(result, divisor) : result;
  }

  // acc[i] = in[i] (kFirst) or acc[i] (+) in[i], with the post-divide fused into the pass over
  // the last input so the accumulator is not swept once more.
  //
  // Vectorization at -O2 hinges on two things. GCC's -O2 cost model ("very-cheap") only
  // vectorizes a loop that needs no scalar epilogue, so the bulk runs as fixed-length chunks
  // and the rest element by element; both do the same IEEE operations per element, so the
  // split changes no result bit. And it will not add runtime alias checks, so the no-alias
  // promise must reach the loop: `__restrict` on parameters is only honoured while this stays
  // a function of its own, hence noinline (one call per input per block costs nothing).
  template <bool kFirst, bool kLast>
  [[gnu::noinline]] static void accumulate(Acc* __restrict acc, const Storage* __restrict in,
                                           size_t len, Acc divisor) {
    size_t i = 0;
    for (; i + kChunk <= len; i += kChunk) {
      for (size_t j = i; j < i + kChunk; ++j) step<kFirst, kLast>(acc, in, j, divisor);
    }
    for (; i < len; ++i) step<kFirst, kLast>(acc, in, i, divisor);
  }

  // Rounds the accumulator to the storage type; noinline for the same reason as accumulate.
  [[gnu::noinline]] static void narrow(Storage* __restrict staged, const Acc* __restrict acc,
                                       size_t len) {
    size_t i = 0;
    for (; i + kChunk <= len; i += kChunk) {
      for (size_t j = i; j < i + kChunk; ++j) staged[j] = Codec::store(acc[j]);
    }
    for (; i < len; ++i) staged[i] = Codec::store(acc[i]);
  }

  void reduce_block(Acc* acc, std::span<const void* const> inputs,
                    std::span<void* const> outputs, size_t begin, size_t len) const {
    const size_t n = inputs.size();
    auto input = [&](size_t k) { return static_cast<const Storage*>(inputs[k]) + begin; };

    if (n == 1) {
      accumulate<true, true>(acc, input(0), len, divisor_);
    } else {
      accumulate<true, false>(acc, input(0), len, divisor_);
      for (size_t k = 1; k + 1 < n; ++k) accumulate<false, false>(acc, input(k), len, divisor_);
      accumulate<false, true>(acc, input(n - 1), len, divisor_);
    }

    if constexpr (std::is_same_v<Acc, Storage>) {
      for (void* out : outputs) {
        std::memcpy(static_cast<Storage*>(out) + begin, acc, len * sizeof(Storage));
      }
    } else {
      // Rounded once into a staging block, then copied, so that several outputs do not pay for
      // the conversion again.
      alignas(64) Storage staged[kBlock];
      narrow(staged, acc, len);
      for (void* out : outputs) {
        std::memcpy(static_cast<Storage*>(out) + begin, staged, len * sizeof(Storage));
      }
    }
  }

  Acc divisor_;
};

template <typename Codec, Combine kCombine, Scale kScale, bool kRoundEach = false>
void run_reducer(const KernelArgs& args, std::span<const void* const> inputs,
                 std::span<void* const> outputs, size_t count) {
  BlockReducer<Codec, kCombine, kScale, kRoundEach>(args.divisor).run(inputs, outputs, count);
}

template <typename Codec, Scale kScale, bool kRoundEach>
void run_sum(const KernelArgs& args, std::span<const void* const> inputs,
             std::span<void* const> outputs, size_t count) {
  run_reducer<Codec, Combine::kSum, kScale, kRoundEach>(args, inputs, outputs, count);
}

// Scaling is only instantiated for floating types; validate_kernel_args rejects it elsewhere.
template <typename Codec, bool kRoundEach = false>
void dispatch_floating(const KernelArgs& args, std::span<const void* const> inputs,
                       std::span<void* const> outputs, size_t count) {
  switch (args.combine) {
    case Combine::kSum:
      switch (args.scale) {
        case Scale::kNone:
          return run_sum<Codec, Scale::kNone, kRoundEach>(args, inputs, outputs, count);
        case Scale::kBefore:
          return run_sum<Codec, Scale::kBefore, kRoundEach>(args, inputs, outputs, count);
        case Scale::kAfter:
          return run_sum<Codec, Scale::kAfter, kRoundEach>(args, inputs, outputs, count);
      }
      return;
    // min/max pick one of the inputs, so narrow and wide accumulation agree; no rounding needed.
    case Combine::kMin:
      return run_reducer<Codec, Combine::kMin, Scale::kNone>(args, inputs, outputs, count);
    case Combine::kMax:
      return run_reducer<Codec, Combine::kMax, Scale::kNone>(args, inputs, outputs, count);
  }
}

template <typename Codec>
void dispatch_half(const KernelArgs& args, std::span<const void* const> inputs,
                   std::span<void* const> outputs, size_t count) {
  if (args.wide_accumulate) {
    dispatch_floating<Codec, false>(args, inputs, outputs, count);
  } else {
    dispatch_floating<Codec, true>(args, inputs, outputs, count);
  }
}

template <typename T>
void dispatch_integer(const KernelArgs& args, std::span<const void* const> inputs,
                      std::span<void* const> outputs, size_t count) {
  using Codec = SameCodec<T>;
  switch (args.combine) {
    case Combine::kSum:
      return run_reducer<Codec, Combine::kSum, Scale::kNone>(args, inputs, outputs, count);
    case Combine::kMin:
      return run_reducer<Codec, Combine::kMin, Scale::kNone>(args, inputs, outputs, count);
    case Combine::kMax:
      return run_reducer<Codec, Combine::kMax, Scale::kNone>(args, inputs, outputs, count);
  }
}

// Messages are static because validate_kernel_args returns a string_view.
struct DTypeMessages {
  DType dtype;
  std::string_view scale_integer;
  std::string_view scale_min_max;
  std::string_view bad_divisor;
};

constexpr DTypeMessages kMessages[] = {
    {DType::kFloat32, {},
     "scaling is only defined for sum, not min or max (float32); use Scale::kNone",
     "divisor must be finite, non-zero and within float32 range when scaling float32"},
    {DType::kFloat64, {},
     "scaling is only defined for sum, not min or max (float64); use Scale::kNone",
     "divisor must be finite and non-zero when scaling float64"},
    {DType::kFloat16, {},
     "scaling is only defined for sum, not min or max (float16); use Scale::kNone",
     "divisor must be finite, non-zero and within float32 range when scaling float16"},
    {DType::kBFloat16, {},
     "scaling is only defined for sum, not min or max (bfloat16); use Scale::kNone",
     "divisor must be finite, non-zero and within float32 range when scaling bfloat16"},
    {DType::kInt32, "scaling is not defined for int32 (use sum without a divisor)", {}, {}},
    {DType::kInt64, "scaling is not defined for int64 (use sum without a divisor)", {}, {}},
    {DType::kUInt8, "scaling is not defined for uint8 (use sum without a divisor)", {}, {}},
};

const DTypeMessages* find_messages(DType dtype) {
  for (const auto& entry : kMessages) {
    if (entry.dtype == dtype) return &entry;
  }
  return nullptr;
}

// The divisor is converted to the accumulation type before dividing, so for everything but
// float64 it must survive the conversion to float32: 1e-50 would become 0, 1e50 infinity.
bool divisor_usable(DType dtype, double divisor) {
  if (!std::isfinite(divisor) || divisor == 0.0) return false;
  if (dtype == DType::kFloat64) return true;
  const float narrowed = static_cast<float>(divisor);
  return std::isfinite(narrowed) && narrowed != 0.0f;
}

}  // namespace

void reduce(const KernelArgs& args, std::span<const void* const> inputs,
            std::span<void* const> outputs, size_t count) {
  // With no inputs there is no result to write.
  if (inputs.empty() || count == 0) return;
  switch (args.dtype) {
    case DType::kFloat32:
      return dispatch_floating<SameCodec<float>>(args, inputs, outputs, count);
    case DType::kFloat64:
      return dispatch_floating<SameCodec<double>>(args, inputs, outputs, count);
    case DType::kFloat16:
      return dispatch_half<Float16Codec>(args, inputs, outputs, count);
    case DType::kBFloat16:
      return dispatch_half<BFloat16Codec>(args, inputs, outputs, count);
    case DType::kInt32:
      return dispatch_integer<int32_t>(args, inputs, outputs, count);
    case DType::kInt64:
      return dispatch_integer<int64_t>(args, inputs, outputs, count);
    case DType::kUInt8:
      return dispatch_integer<uint8_t>(args, inputs, outputs, count);
  }
}

std::string_view validate_kernel_args(const KernelArgs& args) {
  const DTypeMessages* messages = find_messages(args.dtype);
  if (messages == nullptr) return "unknown dtype value in kernel args";
  switch (args.combine) {
    case Combine::kSum:
    case Combine::kMin:
    case Combine::kMax:
      break;
    default:
      return "unknown combine value in kernel args";
  }
  switch (args.scale) {
    case Scale::kNone:
      return "";
    case Scale::kBefore:
    case Scale::kAfter:
      break;
    default:
      return "unknown scale value in kernel args";
  }
  if (!messages->scale_integer.empty()) return messages->scale_integer;
  if (args.combine != Combine::kSum) return messages->scale_min_max;
  if (!divisor_usable(args.dtype, args.divisor)) return messages->bad_divisor;
  return "";
}

}  // namespace gradsync::reduce
