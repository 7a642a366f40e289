// Fused gradient health on the GPU (reduce/health.h): the inf/NaN flag and the float64 sum of
// squares of an allreduce's result, computed by a kernel that reads one copy of the result after
// the scatter wrote it (one read of the bucket's bytes, on the GPU; the trainer makes no pass).
//
// One health block per warp: lane j sums the squares of the block's elements i with
// i mod 32 == j, in increasing i (consecutive lanes read consecutive elements, so every step of
// the warp is one coalesced load), and lane 0 adds the 32 lane sums in lane order. That is
// reduce/health.h's definition exactly, so the sum has the bits the host computes (simd.cc),
// on every GPU and every run. Multiplies and adds are rounded one by one (__dmul_rn and
// __dadd_rn on the GPU, which nvcc never fuses into an FMA; the host build has no FMA
// contraction, as simd.cc relies on too).
#pragma once

#include <cstdint>
#include <string>

#include "daemon/reduce/combine.h"
#include "daemon/reduce/health.h"
#include "shared/dtype.h"
#include "shared/hd.h"
#include "shared/status.h"

namespace gradsync::cuda {

// One health block of a result tensor: `count` <= kHealthBlockElements elements from `data`,
// its sums written to HealthTable::out[out].
struct HealthItem {
  const void* data = nullptr;
  uint64_t out = 0;
  uint32_t count = 0;
};

// What one launch needs, in memory the kernel can read (device memory on the GPU).
struct HealthTable {
  const HealthItem* items = nullptr;
  uint64_t item_count = 0;
  reduce::HealthBlock* out = nullptr;
};

GRADSYNC_HD inline double health_add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

GRADSYNC_HD inline double health_square(double x) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(x, x);
#else
  return x * x;
#endif
}

// Lane `lane`'s part of an item: its sum of squares, and whether any of its elements is an inf
// or a NaN (x - x is 0 for every finite x and NaN otherwise).
template <typename Codec>
struct HealthLane {
  GRADSYNC_HD static void run(const HealthItem& item, uint32_t lane, double* sum, bool* nonfinite) {
    const auto* p = static_cast<const typename Codec::Storage*>(item.data);
    double s = 0;
    bool bad = false;
    for (uint32_t i = lane; i < item.count; i += static_cast<uint32_t>(reduce::kHealthLanes)) {
      const double x = static_cast<double>(Codec::load(p[i]));
      s = health_add(s, health_square(x));
      bad = bad || !(x - x == 0.0);
    }
    *sum = s;
    *nonfinite = bad;
  }
};

// An item's block from its lanes, as the kernel's lane 0 adds them: in lane order, from 0. The
// host's stand-in (tests, the fake launcher) runs the lanes one after another through this.
template <typename Codec>
GRADSYNC_HD reduce::HealthBlock health_of_item(const HealthItem& item) {
  reduce::HealthBlock block;
  bool bad = false;
  for (uint32_t lane = 0; lane < reduce::kHealthLanes; ++lane) {
    double s = 0;
    bool lane_bad = false;
    HealthLane<Codec>::run(item, lane, &s, &lane_bad);
    block.sum_sq = health_add(block.sum_sq, s);
    bad = bad || lane_bad;
  }
  block.nonfinite = bad ? 1u : 0u;
  return block;
}

// Calls body.template operator()<Codec>() with the codec of a floating dtype (the kernels and
// the host's stand-in select alike); other dtypes have no health.
template <typename Body>
Status dispatch_health(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat32: return body.template operator()<reduce::SameCodec<float>>();
    case DType::kFloat64: return body.template operator()<reduce::SameCodec<double>>();
    case DType::kFloat16: return body.template operator()<reduce::Float16Codec>();
    case DType::kBFloat16: return body.template operator()<reduce::BFloat16Codec>();
    default: return Status::invalid_argument("health of " + std::string(dtype_name(dtype)) + " is not defined");
  }
}

}  // namespace gradsync::cuda
