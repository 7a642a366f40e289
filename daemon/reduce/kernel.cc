#include "daemon/reduce/kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "daemon/reduce/simd.h"
#include "shared/dtype.h"

namespace gradsync::reduce {
namespace {

// Elements are reduced in blocks whose accumulator stays in L1: every input's block is read
// before any output's block is written, which is what makes in-place (aliased) calls correct,
// and the accumulator is written out with memcpy at full store bandwidth.
constexpr size_t kBlockBytes = 32 << 10;
static_assert(kBlockBytes % (kHealthBlockElements * 8) == 0, "a block holds whole health blocks of every dtype");

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


// The health blocks of `len` results of the call, held at `results`, which start at element
// `begin` of the call (a multiple of kHealthBlockElements: kBlockBytes holds a whole number of
// health blocks of every dtype).
void health_of(const KernelArgs& args, const void* results, size_t begin, size_t len) {
  const size_t size = dtype_size(args.dtype);
  for (size_t at = 0; at < len; at += kHealthBlockElements) {
    args.health[(begin + at) / kHealthBlockElements] =
        simd::health(args.dtype, static_cast<const std::byte*>(results) + at * size,
                     std::min(kHealthBlockElements, len - at));
  }
}

// Reduces `count` elements block by block: all inputs are folded into an L1-sized block
// (simd.h's loop; the half types rounded to their dtype on the way), which is then copied to
// every output. The block is kBlockBytes (32 KiB: 4096 doubles, 8192 floats, 16384 halves)
// plus kPage of slack for its placement: 36 KiB of stack, no allocation per call.
void reduce_blocks(const KernelArgs& args, std::span<const void* const> inputs,
                   std::span<void* const> outputs, size_t count) {
  const size_t size = dtype_size(args.dtype);
  // A whole number of pages of every buffer per block, so one placement serves every block.
  const size_t block = kBlockBytes / size;
  alignas(64) std::byte storage[kBlockBytes + kPage];
  void* result = place_accumulator(storage, inputs, outputs);
  // An output that is also an input (in place) needs no store at all when the block holds
  // exactly that input's bytes: one input, nothing scaled, a dtype that loads and stores
  // without rounding.
  const bool identity = inputs.size() == 1 && args.scale == Scale::kNone && !dtype_is_half(args.dtype);
  const auto is_input = [&](const void* out) { return std::find(inputs.begin(), inputs.end(), out) != inputs.end(); };
  if (identity && std::all_of(outputs.begin(), outputs.end(), is_input)) {
    // The results are the input's bytes: their health is read from there.
    if (args.health) health_of(args, inputs[0], 0, count);
    return;
  }
  for (size_t begin = 0; begin < count; begin += block) {
    const size_t len = std::min(block, count - begin);
    simd::fold_narrow(args, inputs, begin, len, result);
    if (args.health) health_of(args, result, begin, len);
    for (void* out : outputs) {
      const bool in_place = is_input(out);
      if (in_place && identity) continue;  // it already holds these bytes
      std::byte* to = static_cast<std::byte*>(out) + begin * size;
      if (args.stream_outputs && !in_place) {
        simd::stream_copy(to, result, len * size);
      } else {
        std::memcpy(to, result, len * size);
      }
    }
  }
  if (args.stream_outputs) simd::stream_fence();  // before the caller publishes the results
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
  reduce_blocks(args, inputs, outputs, count);
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
