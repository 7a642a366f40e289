// Element-wise reduction of the local clients' buffers: the arithmetic core of every bucket.
//
// Contract: result[i] = scale(in[0][i] (+) in[1][i] (+) ... (+) in[n-1][i]), combined strictly in
// input order, so the result is bit-identical from run to run and independent of how callers
// split the element range across threads. The result is written to every output. Inputs and
// outputs may alias (in-place all-reduce): the kernel reads a whole cache-sized block of every
// input before it writes that block to any output.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "daemon/reduce/health.h"

#include "shared/dtype.h"

namespace gradsync::reduce {

enum class Combine { kSum, kMin, kMax };

// When the divide happens. kBefore divides every input before combining (prescale, for fp16
// overflow safety); kAfter divides the combined value. Scaling is valid only with
// Combine::kSum on floating dtypes; validate_kernel_args rejects anything else.
enum class Scale { kNone, kBefore, kAfter };

struct KernelArgs {
  DType dtype = DType::kFloat32;
  Combine combine = Combine::kSum;
  Scale scale = Scale::kNone;
  // Used when scale != kNone. The divide happens in the accumulation type (float32 for float32
  // and the half types), so the divisor must be finite, non-zero and representable there.
  double divisor = 1.0;
  // float16/bfloat16 only: accumulate (and divide) in float32 and round to nearest even once
  // at the end. When false, every partial result is rounded back to the half type.
  bool wide_accumulate = true;
  // How outputs that are not also inputs are written: set for results far larger than the
  // cache, which nobody reads before they leave it (simd::stream_copy). Outputs that are
  // inputs (in place) were just read, so their lines are cached and are written normally.
  bool stream_outputs = false;
  // Fused gradient health (health.h): when set, the health of the results is written here,
  // one HealthBlock per kHealthBlockElements of the call (the last may be shorter), computed
  // from each result block while it is in L1. The call must start at a health block boundary
  // of one tensor and stay within it (health.h says why). Floating dtypes only.
  HealthBlock* health = nullptr;
};

// Reduces `count` elements. `inputs` (at least one; none writes nothing) and `outputs` hold one
// pointer per buffer, each to `count` elements of args.dtype. The kernel assumes args passed
// validate_kernel_args.
void reduce(const KernelArgs& args, std::span<const void* const> inputs,
            std::span<void* const> outputs, size_t count);

// Empty string when args are valid, otherwise a message naming what is wrong, e.g.
// "scaling is not defined for int32 (use sum without a divisor)".
std::string_view validate_kernel_args(const KernelArgs& args);

}  // namespace gradsync::reduce
