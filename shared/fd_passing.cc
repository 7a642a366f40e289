#include "shared/fd_passing.h"

#include <sys/socket.h>

#include <cstring>

namespace gradsync {

ssize_t send_with_fds(int socket, std::span<const std::byte> bytes, std::span<const int> fds, int flags) {
  iovec io{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  // Room for as many as the kernel lets one message carry (SCM_MAX_FD), and credentials: what
  // does not fit, the kernel closes inside recvmsg, on this thread, where the last close of a
  // hostile descriptor (a lingering socket) can block. The excess over kMaxFdsPerMessage is
  // ours to refuse instead.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsInMessage) + CMSG_SPACE(sizeof(ucred))] = {};
  if (!fds.empty()) {
    if (fds.size() > kMaxFdsPerMessage) {
      errno = EINVAL;
      return -1;
    }
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(socket, &message, flags | MSG_NOSIGNAL);
}

ssize_t receive_with_fds(int socket, std::span<std::byte> buffer, int flags, Received* out) {
  iovec io{buffer.data(), buffer.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  // Room for as many as the kernel lets one message carry (SCM_MAX_FD), and credentials: what
  // does not fit, the kernel closes inside recvmsg, on this thread, where the last close of a
  // hostile descriptor (a lingering socket) can block. The excess over kMaxFdsPerMessage is
  // ours to refuse instead.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsInMessage) + CMSG_SPACE(sizeof(ucred))] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(socket, &message, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  out->bytes = static_cast<size_t>(n);
  out->fds.clear();
  // Take ownership of whatever arrived before looking at flags, so nothing leaks either way.
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
      out->fds.emplace_back(fd);
    }
  }
  out->fds_truncated = (message.msg_flags & MSG_CTRUNC) != 0 || out->fds.size() > kMaxFdsPerMessage;
  return n;
}

}  // namespace gradsync
