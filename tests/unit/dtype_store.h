// Test helper shared by the kernel tests: writes a double as one element of a dtype (rounding
// to nearest even for floating types, converting for integers). Tests pick exact values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "shared/dtype.h"
#include "shared/half.h"

namespace gradsync::test {

template <typename T>
void store_raw(std::byte* at, T value) {
  std::memcpy(at, &value, sizeof(T));
}

inline void store_as(DType dtype, std::byte* at, double value) {
  switch (dtype) {
    case DType::kFloat32: return store_raw(at, static_cast<float>(value));
    case DType::kFloat64: return store_raw(at, value);
    case DType::kFloat16: return store_raw(at, float_to_half(static_cast<float>(value)));
    case DType::kBFloat16: return store_raw(at, float_to_bfloat16(static_cast<float>(value)));
    case DType::kInt32: return store_raw(at, static_cast<int32_t>(value));
    case DType::kInt64: return store_raw(at, static_cast<int64_t>(value));
    case DType::kUInt8: return store_raw(at, static_cast<uint8_t>(value));
  }
}

}  // namespace gradsync::test
