// The element loops of the reduction, written once with Google Highway and compiled for every
// x86 (or Arm) SIMD level; the best one the CPU supports is chosen at run time. kernel.cc keeps
// the blocking, the accumulator placement and the copies to the outputs; these are the loops
// over one block.
//
// Contract: every function does, per element, exactly the IEEE operations that combine.h's
// scalar codecs and combine() do (the same loads, rounding to nearest even, true divides, NaN
// and tie rules), so the result is bit-identical whichever SIMD level runs and whatever part of
// a range falls in a scalar tail. Where a target cannot convert float16 exactly in vectors (x86
// below AVX2 has no F16C, and Highway's emulation truncates), that dtype runs scalar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "daemon/reduce/health.h"
#include "daemon/reduce/kernel.h"

namespace gradsync::reduce::simd {

// acc[i] = scale(in[0][offset + i] (+) in[1][offset + i] (+) ...) for i < count, combined in
// input order with the prescale or post-divide of args.scale; without wide_accumulate every
// partial result is rounded to the half type. `inputs` hold args.dtype, `acc` the accumulation
// type (float32 for the half types, the dtype otherwise); `acc` may not overlap any input.
// Each element is computed in registers from all inputs and stored once.
void fold(const KernelArgs& args, std::span<const void* const> inputs, size_t offset, size_t count, void* acc);

// fold(), with the result rounded to args.dtype as narrow() does: `out` holds args.dtype.
void fold_narrow(const KernelArgs& args, std::span<const void* const> inputs, size_t offset, size_t count,
                 void* out);

// out[i] = acc[i] rounded to args.dtype (the half types) or copied (every other dtype).
void narrow(DType dtype, void* out, const void* acc, size_t count);

// The cross-node combine (staged.h's combiner): out[i] = a[i] (+) b[i] over `count` elements of
// the accumulation type `acc` (float32, float64, int32, int64 or uint8). With round_to float16
// or bfloat16 (narrow accumulation), every sum is rounded to it, as the scalar codec does;
// round_to = acc rounds nothing. `out` may alias `a` or `b`.
struct PairArgs {
  DType acc = DType::kFloat32;
  Combine combine = Combine::kSum;
  DType round_to = DType::kFloat32;
};
void combine_pair(const PairArgs& args, void* out, const void* a, const void* b, size_t count);

// Wire compression: out[i] = round_to_wire(float(a[i]) (+) float(b[i])) over `count` elements
// of `wire` (float16 or bfloat16); out may alias a or b. And float32 out[i] = in[i] widened
// from a half type, exactly (narrow() is the other way).
void combine_wire(DType wire, Combine combine, void* out, const void* a, const void* b, size_t count);
void widen(DType dtype, void* out, const void* in, size_t count);

// memcpy(dst, src, bytes), with streaming (non-temporal) stores for the part of dst that is
// vector-aligned: each line is written once, without first being read into the cache, which
// halves the memory traffic of writing a result that nobody reads before it leaves the cache.
// Streaming stores are weakly ordered: the thread that made them must call stream_fence()
// before anything that publishes the bytes (a release store, a mutex, a completion), so a
// caller copying many blocks fences once at the end rather than after every block.
void stream_copy(void* dst, const void* src, size_t bytes);
void stream_fence();

// The health (health.h) of one block of `count` <= kHealthBlockElements elements of `dtype`
// (a floating dtype), as stored: the same bits on every SIMD level (kHealthLanes logical
// lanes, held in as many vectors as a level needs).
HealthBlock health(DType dtype, const void* block, size_t count);

// The name of the SIMD level fold() and narrow() run on, e.g. "AVX2" (for logs and benchmarks).
const char* target_name();

// Test hook: every SIMD level compiled in that this CPU supports, as Highway target bits, and a
// way to pin one (0 restores the automatic choice). Not for the daemon: it changes the choice
// for the whole process.
std::vector<int64_t> supported_targets();
void pin_target_for_test(int64_t target);

}  // namespace gradsync::reduce::simd
