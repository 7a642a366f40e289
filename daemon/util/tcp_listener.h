// A gRPC service's TCP listener (the peer service's; the admin service's TLS port): the daemon
// accepts connections itself and hands each to gRPC through an external connection acceptor,
// with the service's credentials (TLS or none), as the admin socket accepts its own. So it
// bounds them before gRPC holds a descriptor:
//   - at most `max_total` descriptors for its connections, well below the descriptor limit,
//     so that a flood on the port cannot take the descriptors the control socket needs; an
//     unproven connection counts twice (the listener keeps a copy of its descriptor, through
//     which it shuts the connection down without racing gRPC's close);
//   - at most `max_per_host` unproven connections from one host (every loopback address is
//     one host); proven ones are bounded by the total only;
//   - a connection that has made no authenticated call (proven()) within `proof_window` is
//     closed: without the token or a certificate nobody holds a connection for long;
//   - past a bound, an unproven connection drawn at random (of that host, or of all) makes
//     way for the newcomer; when every held connection is proven, the newcomer is closed at
//     once (logged once a second at most);
//   - an accept that fails (out of descriptors, or otherwise) pauses and retries: the port
//     never goes deaf.
// gRPC names a connection handed this way by its address ("ipv4:10.0.0.2:41234"), as one it
// accepted itself.
#pragma once

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/util/log.h"
#include "shared/unique_fd.h"
#include "shared/mutex.h"

namespace gradsync {

struct TcpListenerLimits {
  size_t max_total = 4096;  // and at most a quarter of the descriptor limit (RLIMIT_NOFILE)
  size_t max_per_host = 64;  // an IPv6 host is its /64
  std::chrono::milliseconds proof_window{5000};
};

class TcpListener {
 public:
  // Binds `listen` (HOST:PORT, [IPv6]:PORT; port 0 picks one) and listens, as gRPC did: a
  // wildcard (0.0.0.0, ::, *) on both IPv4 and IPv6, a name on every address it resolves to.
  // `service` names it in logs and errors ("peer service"); `option` is the flag that set
  // `listen` ("--peer-listen"). Throws Error naming the address when it cannot.
  TcpListener(const std::string& listen, TcpListenerLimits limits, Logger log, std::string service = "peer service",
              std::string option = "--peer-listen");
  ~TcpListener();  // stops accepting
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  int port() const { return port_; }
  // Before the server is built: makes `builder` take connections from this listener, with
  // `credentials`.
  void attach(grpc::ServerBuilder* builder, std::shared_ptr<grpc::ServerCredentials> credentials);
  // Once the server has started: starts accepting.
  void start();
  // Stops accepting (joins the accept thread).
  void stop();
  // The connection gRPC names `peer` made a call that passed authentication: it stays past
  // the proof window. Called on gRPC threads.
  void proven(const std::string& peer);

 private:
  struct Handed {
    std::string host;  // "ipv4:10.0.0.2", or "loopback"
    std::string peer;  // "ipv4:10.0.0.2:41234"
    ino_t inode = 0;
    std::chrono::steady_clock::time_point accepted;
    bool proven = false;
    UniqueFd hold;  // this listener's copy of the descriptor, while unproven
  };
  void accept_loop();
  // Takes `fd` in, making way past a bound; false when it must be closed. Under mutex_.
  bool admit_locked(int fd, const std::string& host, const std::string& peer) GS_REQUIRES(mutex_);
  // Closes (shuts down, for gRPC to close) unproven connections past the proof window.
  void expire_unproven();
  // Shuts an unproven connection down (through its copy), and forgets it.
  void drop_locked(std::map<int, Handed>::iterator it) GS_REQUIRES(mutex_);
  void forget_locked(std::map<int, Handed>::iterator it) GS_REQUIRES(mutex_);
  void uncount_unproven_locked(const std::string& host) GS_REQUIRES(mutex_);
  // Drops entries whose descriptor gRPC has closed (or reused); under mutex_.
  void prune_locked() GS_REQUIRES(mutex_);
  // Logs the connections closed since the last line, once a second at most. Accept thread.
  void log_closures(const std::string& last_peer);

  TcpListenerLimits limits_;
  Logger log_;
  std::string service_;
  std::vector<UniqueFd> listen_fds_;
  UniqueFd wake_fd_;
  int port_ = 0;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  Mutex mutex_;
  std::map<int, Handed> handed_ GS_GUARDED_BY(mutex_);  // by descriptor
  std::map<std::string, int> by_peer_ GS_GUARDED_BY(mutex_);  // peer -> descriptor
  std::map<std::string, size_t> unproven_by_host_ GS_GUARDED_BY(mutex_);
  size_t unproven_ GS_GUARDED_BY(mutex_) = 0;
  std::minstd_rand random_ GS_GUARDED_BY(mutex_){std::random_device{}()};
  std::chrono::steady_clock::time_point last_prune_ GS_GUARDED_BY(mutex_);
  struct Closed {
    size_t refused = 0;    // newcomers, every held connection being proven
    size_t made_way = 0;   // unproven, for a newcomer
    size_t unproven = 0;   // past the proof window
  };
  Closed closed_;  // since the last log line; accept thread only (admit_locked, expire_unproven)
  std::chrono::steady_clock::time_point last_log_;  // accept thread only
  std::thread thread_;
};

}  // namespace gradsync
