// The per-step memory of a job (shared/channel_layout.h), created by the daemon as memfds and
// handed to each client by descriptor when it joins. Nothing has a name, so no process can
// reach a job's rings except through the descriptors the daemon chose to hand over.
#pragma once

#include <memory>

#include "shared/channel_layout.h"
#include "shared/memfd.h"
#include "shared/status.h"

namespace gradsync {

// The job's doorbell page. The Job keeps the descriptor, to hand a duplicate to every client.
class JobDoorbell {
 public:
  // Throws Error when the memory cannot be created.
  JobDoorbell();
  DoorbellPage* page() const { return reinterpret_cast<DoorbellPage*>(memory_.data()); }
  // A new descriptor of the page for one client.
  UniqueFd duplicate() const;

 private:
  MappedMemfd memory_;
};

// One client's rings: ClientRings (the client writes) and DaemonRings (sealed so that the client
// can only map it read-only). The daemon's own mappings stay writable.
class ClientChannel {
 public:
  // Throws Error when the memory cannot be created.
  ClientChannel();
  ClientRings* client() const { return reinterpret_cast<ClientRings*>(client_rings_.data()); }
  DaemonRings* daemon() const { return reinterpret_cast<DaemonRings*>(daemon_rings_.data()); }

  // The descriptors for the JoinReply; the daemon keeps only its mappings. Call once.
  UniqueFd release_client_fd() { return client_rings_.release_fd(); }
  UniqueFd release_daemon_fd() { return daemon_rings_.release_fd(); }

  // Publishes the job's sticky error to the client (message first, then the code).
  void publish_failure(const Status& status) const;

  // The completion wake-up, as the daemon sees it.
  WakeRef completion_ready() const { return WakeRef{&daemon()->completion_seq, &client()->completion_waiters}; }

 private:
  MappedMemfd client_rings_;
  MappedMemfd daemon_rings_;
};

}  // namespace gradsync
