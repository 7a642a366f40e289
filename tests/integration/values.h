// Deterministic test inputs and an independent reference for every dtype and reduction mode,
// so each client process can compute what every rank contributed and what the result must be.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradsync/client.h"
#include "shared/half.h"

namespace gradsync::test {

// An input value before conversion to the tensor's dtype: varied signs and magnitudes, some
// of which are not exactly representable in float16/bfloat16.
inline double raw_value(int rank, uint64_t tensor, uint64_t i, int seed) {
  const uint64_t h = (static_cast<uint64_t>(rank) * 7919 + i * 104729 + tensor * 613 + static_cast<uint64_t>(seed) * 31) % 2003;
  return (static_cast<double>(h) - 1001.0) / 7.0;
}

// Stores `value` as element i of a buffer of `dtype` (integers take the rounded value).
inline void store(DType dtype, std::byte* data, uint64_t i, double value) {
  switch (dtype) {
    case DType::kFloat32: reinterpret_cast<float*>(data)[i] = static_cast<float>(value); break;
    case DType::kFloat64: reinterpret_cast<double*>(data)[i] = value; break;
    case DType::kFloat16: reinterpret_cast<uint16_t*>(data)[i] = float_to_half(static_cast<float>(value)); break;
    case DType::kBFloat16: reinterpret_cast<uint16_t*>(data)[i] = float_to_bfloat16(static_cast<float>(value)); break;
    case DType::kInt32: reinterpret_cast<int32_t*>(data)[i] = static_cast<int32_t>(std::lround(value * 1e6)); break;
    case DType::kInt64: reinterpret_cast<int64_t*>(data)[i] = std::llround(value * 1e12); break;
    case DType::kUInt8: reinterpret_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(std::lround(value) & 0xff); break;
  }
}

inline void fill(const SharedTensor& t, int rank, uint64_t tensor, int seed) {
  for (uint64_t i = 0; i < t.numel(); ++i) store(t.dtype(), t.data(), i, raw_value(rank, tensor, i, seed));
}

// The bytes of element i as rank `rank` filled it.
inline std::vector<std::byte> input_bytes(DType dtype, int rank, uint64_t tensor, uint64_t i, int seed) {
  std::vector<std::byte> bytes(dtype_size(dtype));
  std::vector<std::byte> scratch(dtype_size(dtype) * (i + 1));
  store(dtype, scratch.data(), i, raw_value(rank, tensor, i, seed));
  std::memcpy(bytes.data(), scratch.data() + i * dtype_size(dtype), bytes.size());
  return bytes;
}

// The expected bytes of element i after reducing all `world` ranks' inputs, following the
// documented semantics: combine in rank order, in float32 for half types (or rounding every
// step when fp32_accumulate is off), divide before or after for avg, wrap for integers.
std::vector<std::byte> expected_reduction(DType dtype, const ReduceOptions& options, int world, uint64_t tensor,
                                          uint64_t i, int seed);

}  // namespace gradsync::test
