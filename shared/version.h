// Versions. The protocol version covers the control messages and the channel layout; a client
// and a daemon must agree on it exactly.
//   1: shared-memory names (no longer spoken)
//   2: memory and rings passed as sealed memfds over SCM_RIGHTS
#pragma once

#include <cstdint>

namespace gradsync {

inline constexpr const char* kGradsyncVersion = "0.2.0";
inline constexpr uint32_t kProtocolVersion = 2;

}  // namespace gradsync
