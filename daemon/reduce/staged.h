// The reduction of kernel.h split into stages, for operations that span nodes:
//   accumulate()  the node's local clients -> one buffer in the accumulation type
//   combiner()    the cross-node combine the engine applies to such buffers
//   finish()      the accumulation buffer -> scaled, rounded results in every output
// float16/bfloat16 accumulate in float32 (rounding once, in finish(), unless wide_accumulate is
// off, in which case every stage rounds to the half type as kernel.h's narrow path does); every
// other dtype accumulates in itself. Combination order within a node is local rank order; across
// nodes it is the engine's algorithm order, which is fixed for a given node count and size.
#pragma once

#include <cstddef>
#include <span>

#include "daemon/reduce/kernel.h"

namespace gradsync::reduce {

// float32 for the half types, the dtype itself otherwise.
DType accumulation_dtype(DType dtype);

// acc[i] = in[0][i] (+) in[1][i] ... with the prescale of Scale::kBefore applied; no post-divide.
void accumulate(const KernelArgs& args, std::span<const void* const> inputs, void* acc, size_t count);

// out = a (+) b over n accumulation-type elements, as the engine's combine function.
using CombinerFn = void (*)(void* out, const void* a, const void* b, size_t n);
CombinerFn combiner(const KernelArgs& args);

// The cross-node combine of buffers compressed to `wire` (float16 or bfloat16) for the wire:
// each pair widened to float32, combined, rounded back to `wire` (every hop rounds once).
CombinerFn wire_combiner(Combine combine, DType wire);

// out[k][i] = round(acc[i] / divisor) for Scale::kAfter, round(acc[i]) otherwise.
void finish(const KernelArgs& args, const void* acc, std::span<void* const> outputs, size_t count);

}  // namespace gradsync::reduce
