// Versions. The protocol version covers the control messages and the channel layout; a client
// and a daemon must agree on it exactly.
#pragma once

#include <cstdint>

namespace gradsync {

inline constexpr const char* kGradsyncVersion = "0.1.0";
inline constexpr uint32_t kProtocolVersion = 1;

}  // namespace gradsync
