// The CUDA backend's per-bucket kernels: one batched gather launch and one batched scatter
// launch per bucket, whatever the number of tensors (functors.h holds their arithmetic). This
// header needs no CUDA headers; streams travel as opaque pointers (cudaStream_t).
#pragma once

#include "daemon/backend/cuda/functors.h"
#include "daemon/backend/cuda/health_functor.h"
#include "daemon/reduce/kernel.h"
#include "shared/status.h"

namespace gradsync::cuda {

// `table` and everything it points to live in device memory (the table itself travels by
// value as a kernel argument). Both enqueue on `stream` and return at once; the error names
// the launch that failed.
Status launch_gather(const reduce::KernelArgs& args, const BucketTable& table, void* stream);
Status launch_scatter(const reduce::KernelArgs& args, const BucketTable& table, void* stream);
// Fused health (health_functor.h): one warp per item of `table`, results of `dtype`.
Status launch_health(DType dtype, const HealthTable& table, void* stream);

// Loads every gather, scatter and health kernel into the current device's context (cudaFuncGetAttributes
// on each), so that no first launch loads a module later: CUDA 12.2+ loads lazily by default,
// and a load may synchronise the context, which would wait on every job's streams. *loaded
// counts the kernels.
Status preload_kernels(int* loaded);

}  // namespace gradsync::cuda
