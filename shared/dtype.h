// Element types gradsync reduces. The numeric values are part of the wire format (control
// protocol and ring entries) and match proto/control.proto's DType enum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gradsync {

enum class DType : uint32_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kUInt8 = 7,
};

// Bytes per element.
size_t dtype_size(DType dtype);

// Lower-case name as users write it ("float32", "bfloat16", ...).
std::string_view dtype_name(DType dtype);

// Validates a raw value that arrived from another process; nullopt when unknown.
std::optional<DType> dtype_from_raw(uint32_t raw);

// Parses a user-facing name; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// float16 and bfloat16: accumulated in float32 by default (DeepSpeed's fp32_allreduce).
bool dtype_is_half(DType dtype);
bool dtype_is_floating(DType dtype);

}  // namespace gradsync
