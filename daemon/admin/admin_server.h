// The admin service (proto/admin.proto, gradsync.admin.v1) over gRPC on a Unix socket, plus the
// standard grpc.health.v1 health service and server reflection.
//
// Who calls: the server accepts connections itself and reads each one's peer credentials
// (SO_PEERCRED). A user not allowed on the control socket is closed on at once; an allowed one's
// descriptor goes to gRPC (AddInsecureChannelFromFd), its credentials remembered under the
// connection's gRPC peer name, by which every call is judged again (PERMISSION_DENIED naming the
// uid) and filtered (others' jobs are shown to privileged callers only).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/admin/view.h"
#include "daemon/control/peer_credentials.h"
#include "daemon/util/log.h"
#include "shared/status.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace gradsync::admin {

struct AdminServerOptions {
  std::string address;  // "unix:/run/gradsync/admin.sock"
  DaemonView* view = nullptr;  // outlives the server
  Logger log;
  // Whether users other than the daemon's own and root may connect (--allow-uid): the socket
  // is then 0666, else 0600, like the control socket; each call is judged by uid either way.
  bool others_allowed = false;
};

class AdminServer {
 public:
  // Binds the socket (replacing a stale one) and starts serving. Throws Error naming the
  // address and the cause when it cannot.
  explicit AdminServer(AdminServerOptions options);
  ~AdminServer();  // stops accepting, shuts gRPC down
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  const std::string& path() const { return path_; }
  // The credentials of the connection gRPC names `peer`; false when unknown.
  bool caller(const std::string& peer, PeerCredentials* out) const;

  // SIGHUP changed --allow-uid: the socket's mode follows (0666 when others may connect).
  void set_others_allowed(bool others) const { ::chmod(path_.c_str(), others ? 0666 : 0600); }

 private:
  void accept_loop();

  AdminServerOptions options_;
  std::string path_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends accept_loop
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex mutex_;
  std::map<std::string, PeerCredentials> callers_;  // by gRPC peer name; guarded by mutex_
  bool out_of_fds_logged_ = false;  // acceptor thread only
  std::thread acceptor_;

  static constexpr int kMaxThreads = 16;
  static constexpr int kMaxStreamsPerConnection = 4;
  static constexpr int kIdleMs = 60'000;
};

}  // namespace gradsync::admin
