// An independent reference for the fused gradient health (daemon/reduce/health.h), written
// from the definition there with plain scalar loops: what a set's results hold, in the order
// the definition fixes. Used by the kernel's unit tests and, through the client's own view of
// its results, by the integration tests.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "shared/dtype.h"
#include "shared/half.h"

namespace gradsync::test {

struct ReferenceHealth {
  bool found_inf = false;
  double sum_sq = 0;
};

inline double element_value(DType dtype, const std::byte* data, size_t i) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, data + i * 4, 4);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, data + i * 8, 8);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, data + i * 2, 2);
      return dtype == DType::kFloat16 ? half_to_float(v) : bfloat16_to_float(v);
    }
    default: return 0;
  }
}

// Adds one tensor's results to `into`: its blocks of 4096, 32 lanes each.
inline void add_tensor_health(DType dtype, const std::byte* data, size_t count, ReferenceHealth* into) {
  constexpr size_t kBlock = 4096;
  for (size_t begin = 0; begin < count; begin += kBlock) {
    double lane[32] = {};
    const size_t end = begin + kBlock < count ? begin + kBlock : count;
    for (size_t i = begin; i < end; ++i) {
      const double x = element_value(dtype, data, i);
      if (!std::isfinite(x)) into->found_inf = true;
      const volatile double square = x * x;  // rounded on its own: never contracted with the add
      lane[(i - begin) % 32] = lane[(i - begin) % 32] + square;
    }
    double block = 0;
    for (double l : lane) block = block + l;
    into->sum_sq = into->sum_sq + block;
  }
}

}  // namespace gradsync::test
