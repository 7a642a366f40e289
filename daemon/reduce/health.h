// Gradient health, fused into the reduction (ReduceOptions::health): whether a reduced result
// holds an inf or a NaN, and its sum of squares in float64, computed on each result block while
// it is still in L1, so the trainer needs no second pass over its gradients (the seeds' S15).
//
// The sum is defined so that it is the same bits whatever computes it: every thread count,
// SIMD level, node and rank. A tensor's elements (the result, as stored in its dtype) are cut
// into blocks of kHealthBlockElements from its start; a block's sum is
//   ((((0 + L0) + L1) + ...) + L31),  Lj = the squares of the block's elements i with
//   i mod 32 == j, each widened to float64 and squared there, added in increasing i from 0;
// and a set's sum is the blocks' sums added in order (tensors in registration order, blocks in
// tensor order), from 0. Every caller therefore hands the kernel calls that start at a block
// boundary of a tensor and stay within one tensor.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradsync::reduce {

inline constexpr size_t kHealthBlockElements = 4096;
// 32 lanes: enough independent sums to keep a core's adders busy on every SIMD level (eight
// chains of four on AVX2), where eight lanes left the loop waiting on its additions.
inline constexpr size_t kHealthLanes = 32;

struct HealthBlock {
  double sum_sq = 0;      // as defined above
  uint32_t nonfinite = 0; // 1 when an element is an inf or a NaN
};

// The health of a set from its blocks' in order.
struct Health {
  bool found_inf = false;
  double sum_sq = 0;
};

}  // namespace gradsync::reduce
