#include "daemon/control/peer_credentials.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace gradsync {

Status read_peer_credentials(int fd, PeerCredentials* credentials) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return Status::internal(std::string("SO_PEERCRED failed: ") + std::strerror(errno));
  }
  credentials->pid = cred.pid;
  credentials->uid = cred.uid;
  credentials->gid = cred.gid;
  return Status::ok_status();
}

}  // namespace gradsync
