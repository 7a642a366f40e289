// Versions. The protocol version covers the control messages and the channel layout; a client
// and a daemon must agree on it exactly.
//   1: shared-memory names (no longer spoken)
//   2: memory and rings passed as sealed memfds over SCM_RIGHTS
//   3: device sets: the daemon makes each client's event rings and sends their handles in the
//      RegisterReply (a version-2 client would announce through events nobody waits on)
#pragma once

#include <cstdint>

namespace gradsync {

inline constexpr const char* kGradsyncVersion = "0.2.0";
inline constexpr uint32_t kProtocolVersion = 3;

}  // namespace gradsync
