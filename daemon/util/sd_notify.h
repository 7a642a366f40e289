// systemd's notification protocol (sd_notify(3)), without libsystemd: datagrams to the socket
// in $NOTIFY_SOCKET ("/path" or "@abstract"). Without the variable (not started by systemd)
// every call does nothing. The watchdog interval comes from $WATCHDOG_USEC (and
// $WATCHDOG_PID, when set, must be this process).
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace gradsync {

class SystemdNotifier {
 public:
  // Reads the environment; unsets nothing, so child processes do not inherit the socket only
  // if the caller clears it.
  SystemdNotifier();

  bool enabled() const { return !socket_.empty(); }
  // How often to send WATCHDOG=1: half the interval systemd enforces; nullopt: no watchdog.
  std::optional<std::chrono::microseconds> watchdog_period() const { return watchdog_period_; }

  // Sends one notification ("READY=1", "STATUS=...", "WATCHDOG=1", "STOPPING=1", several
  // lines at once); false when it could not be sent (logged by the caller if it cares).
  bool notify(const std::string& message) const;

 private:
  std::string socket_;
  std::optional<std::chrono::microseconds> watchdog_period_;
};

}  // namespace gradsync
