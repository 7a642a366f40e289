// The admin service (proto/admin.proto, gradsync.admin.v1) over gRPC on a Unix socket, plus the
// standard grpc.health.v1 health service and server reflection.
//
// Who calls: the server accepts connections itself, reads each one's peer credentials
// (SO_PEERCRED) and hands the descriptor to gRPC (AddInsecureChannelFromFd), remembering the
// credentials under the connection's gRPC peer name. Every call is then judged by its caller's
// uid: users not allowed on the control socket get PERMISSION_DENIED naming their uid.
#pragma once

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
  std::thread acceptor_;
};

}  // namespace gradsync::admin
