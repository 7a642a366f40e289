#include "daemon/util/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace gradsync {

SystemdNotifier::SystemdNotifier() {
  if (const char* socket = std::getenv("NOTIFY_SOCKET"); socket && (socket[0] == '/' || socket[0] == '@')) {
    socket_ = socket;
  }
  const char* usec = std::getenv("WATCHDOG_USEC");
  const char* pid = std::getenv("WATCHDOG_PID");
  if (usec && *usec && (!pid || !*pid || std::strtoll(pid, nullptr, 10) == ::getpid())) {
    const long long value = std::strtoll(usec, nullptr, 10);
    if (value > 0) watchdog_period_ = std::chrono::microseconds(value / 2);
  }
}

bool SystemdNotifier::notify(const std::string& message) const {
  if (socket_.empty()) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, socket_.data(), socket_.size());
  if (address.sun_path[0] == '@') address.sun_path[0] = '\0';  // the abstract namespace
  const socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_.size());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const ssize_t sent =
      ::sendto(fd, message.data(), message.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&address), length);
  ::close(fd);
  return sent == static_cast<ssize_t>(message.size());
}

}  // namespace gradsync
