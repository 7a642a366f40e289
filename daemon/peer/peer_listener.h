// The peer service's TCP listener, when the peer service runs on the cluster token (no TLS):
// the daemon accepts connections itself and hands each to gRPC (AddInsecureChannelFromFd), as
// the admin socket does, so that it can bound them before gRPC holds a descriptor:
//   - at most `max_total` live connections, and `max_per_host` from one host (every loopback
//     address counts as one host), well below the descriptor limit, so a flood on the peer
//     port cannot take the descriptors the control socket needs;
//   - more are closed at once (logged once a second at most);
//   - an accept that fails for lack of descriptors pauses and retries; one that fails
//     otherwise is retried too, never leaving the port deaf.
// gRPC names a connection handed by descriptor "fd:N": peer_of() gives back "ipv4:ADDR:PORT"
// as gRPC would have, for the per-caller bounds. Connections that make no call for a few
// seconds are closed by gRPC (max_connection_idle), so silent ones do not stay.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/util/log.h"
#include "shared/unique_fd.h"

namespace gradsync {

struct PeerListenerLimits {
  size_t max_total = 4096;  // and at most a quarter of the descriptor limit (RLIMIT_NOFILE)
  size_t max_per_host = 64;  // an IPv6 host is its /64
};

class PeerListener {
 public:
  // Binds `listen` (HOST:PORT, [IPv6]:PORT; port 0 picks one) and listens, as gRPC did: a
  // wildcard (0.0.0.0, ::, *) on both IPv4 and IPv6, a name on every address it resolves to.
  // Throws Error naming the address when it cannot.
  PeerListener(const std::string& listen, PeerListenerLimits limits, Logger log);
  ~PeerListener();  // stops accepting
  // Stops accepting (joins the accept thread); peer_of() keeps answering.
  void stop();
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  int port() const { return port_; }
  // Starts handing accepted connections to `server` (built without listening ports).
  void start(grpc::Server* server);
  // gRPC's name for a handed connection ("fd:7") to its address ("ipv4:10.0.0.2:41234");
  // anything else as it is.
  std::string peer_of(const std::string& grpc_peer) const;

 private:
  struct Handed {
    std::string host;  // "ipv4:10.0.0.2", or "loopback"
    std::string peer;  // "ipv4:10.0.0.2:41234"
    ino_t inode = 0;
  };
  void accept_loop();
  // Drops entries whose descriptor gRPC has closed (or reused); under mutex_.
  void prune_locked();

  PeerListenerLimits limits_;
  Logger log_;
  std::vector<UniqueFd> listen_fds_;
  UniqueFd wake_fd_;
  int port_ = 0;
  grpc::Server* server_ = nullptr;
  mutable std::mutex mutex_;
  std::map<int, Handed> handed_;  // by descriptor; guarded by mutex_
  std::thread thread_;
};

}  // namespace gradsync
