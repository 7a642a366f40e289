// A compute kernel for the separate-context benchmark (device check (c)): fused multiply-adds
// over a buffer, long enough to time, standing in for a trainer's backward pass.
#pragma once

#include <cstddef>

namespace gradsync::bench {

// Enqueues the kernel on `stream` (a cudaStream_t) over `elements` floats at `data`, `rounds`
// FMAs per element. Returns false when the launch failed.
bool launch_busy(float* data, size_t elements, int rounds, void* stream);

// Enqueues one block that spins on the GPU for `milliseconds` (by the GPU's global timer), so
// that whatever is queued behind it on `stream` waits that long with a kernel in flight.
bool launch_spin(int milliseconds, void* stream);

}  // namespace gradsync::bench
