// Sending and receiving file descriptors with bytes over a Unix stream socket (SCM_RIGHTS).
//
// Contract of the control protocol: a frame that carries descriptors is sent with one sendmsg()
// whose ancillary data holds all of them, and the frame's `fd_count` field says how many. The
// kernel delivers descriptors together with the first byte they were sent with and ends a
// recvmsg() right after them, so the receiver can tell which frame a batch belongs to from the
// stream offset at which it arrived (see FdInbox).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <vector>

#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

// At most this many descriptors travel with one message; more is a protocol error.
inline constexpr size_t kMaxFdsPerMessage = 16;
// The most descriptors the kernel passes in one message (SCM_MAX_FD).
inline constexpr size_t kMaxFdsInMessage = 253;

// sendmsg() with `fds` attached to `bytes`. Returns the bytes sent (possibly fewer than asked;
// the descriptors went with them), or -1 with errno set.
ssize_t send_with_fds(int socket, std::span<const std::byte> bytes, std::span<const int> fds, int flags);

struct Received {
  size_t bytes = 0;            // 0 with no descriptors: end of stream
  std::vector<UniqueFd> fds;   // close-on-exec
  bool fds_truncated = false;  // the sender attached more than kMaxFdsPerMessage (all of them are in `fds`)
};

// recvmsg() into `buffer`. Returns -1 with errno set on error (EAGAIN included).
ssize_t receive_with_fds(int socket, std::span<std::byte> buffer, int flags, Received* out);

}  // namespace gradsync
