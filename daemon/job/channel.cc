#include "daemon/job/channel.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace gradsync {

JobDoorbell::JobDoorbell() : memory_(MappedMemfd::create("doorbell", kDoorbellBytes)) {
  new (memory_.data()) DoorbellPage();
  memory_.seal(kSizeSeals);
}

UniqueFd JobDoorbell::duplicate() const {
  UniqueFd fd(::fcntl(memory_.fd().get(), F_DUPFD_CLOEXEC, 0));
  if (!fd) throw Error(Status::resource_exhausted(std::string("cannot duplicate the doorbell: ") + std::strerror(errno)));
  return fd;
}

ClientChannel::ClientChannel()
    : client_rings_(MappedMemfd::create("client-rings", kClientRingsBytes)),
      daemon_rings_(MappedMemfd::create("daemon-rings", kDaemonRingsBytes)) {
  new (client_rings_.data()) ClientRings();
  new (daemon_rings_.data()) DaemonRings();
  client_rings_.seal(kSizeSeals);
  // After the daemon's writable mapping exists: every later writable mapping, write() or
  // reopened descriptor is refused, so the client can only read its completions.
  daemon_rings_.seal(kSizeSeals | F_SEAL_FUTURE_WRITE);
}

void ClientChannel::publish_failure(const Status& status) const {
  DaemonRings* rings = daemon();
  if (rings->failure_code.load(std::memory_order_acquire) != 0) return;
  const size_t length = std::min(status.message().size(), sizeof(rings->failure_message));
  std::memcpy(rings->failure_message, status.message().data(), length);
  rings->failure_length = static_cast<uint32_t>(length);
  const ErrorCode code = status.code() == ErrorCode::kOk ? ErrorCode::kAborted : status.code();
  rings->failure_code.store(static_cast<uint32_t>(code), std::memory_order_release);
}

}  // namespace gradsync
