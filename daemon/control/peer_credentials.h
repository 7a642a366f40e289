// Who is on the other end of a Unix socket, from the kernel (SO_PEERCRED), not from the peer.
#pragma once

#include <sys/types.h>

#include "shared/status.h"

namespace gradsync {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

Status read_peer_credentials(int fd, PeerCredentials* credentials);

}  // namespace gradsync
