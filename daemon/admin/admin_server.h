// The admin service (proto/admin.proto, gradsync.admin.v1) over gRPC on a Unix socket, plus the
// standard grpc.health.v1 health service and server reflection.
//
// Who calls, on the Unix socket: the server accepts connections itself and reads each one's
// peer credentials (SO_PEERCRED). A user not allowed on the control socket is closed on at once;
// an allowed one's descriptor goes to gRPC (AddInsecureChannelFromFd), its credentials
// remembered under the connection's gRPC peer name, by which every call is judged again
// (PERMISSION_DENIED naming the uid) and filtered (others' jobs are shown to privileged callers
// only). Over TCP (optional): gRPC's TLS with client certificates required and verified against
// the configured CA; a caller is the local user its certificate's common name names, judged by
// the same rules, or privileged when the name is listed as an administrator.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/admin/admin_service.h"
#include "daemon/admin/view.h"
#include "daemon/control/peer_credentials.h"
#include "daemon/control/owned_paths.h"
#include "daemon/util/log.h"
#include "daemon/util/tcp_listener.h"
#include "shared/status.h"
#include "shared/mutex.h"

namespace grpc {
class AuthContext;
class AuthMetadataProcessor;
class Server;
class ServerContext;
class Service;
}  // namespace grpc

namespace gradsync::admin {

// The admin service over TCP: mutual TLS, every caller with a certificate the CA signed.
struct AdminTls {
  std::string address;  // HOST:PORT; empty: no TCP
  std::string cert_file, key_file, ca_file;
  std::vector<std::string> admin_cns;  // privileged common names
};

struct AdminServerOptions {
  std::string address;  // "unix:/run/gradsync/admin.sock", or "none" (then tcp must be given)
  DaemonView* view = nullptr;  // outlives the server
  Logger log;
  // Whether users other than the daemon's own and root may connect (--allow-uid): the socket
  // is then 0666, else 0600, like the control socket; each call is judged by uid either way.
  bool others_allowed = false;
  AdminTls tcp;
  // Connections one user may hold open on the Unix socket; more are closed at once (gRPC owns a
  // connection's descriptor once handed it, so without a cap one allowed user could take them all).
  size_t connections_per_user = 16;
  // Connections all users may hold open on the Unix socket together (many allowed users, or a
  // group); 0: an eighth of the descriptor limit, at most 1,024. Root and the daemon's own user
  // are held to connections_per_user only.
  size_t connections_total = 0;
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
  // Who the call's connection belongs to; false (with *why) when it cannot be told.
  bool caller(grpc::ServerContext* context, Caller* out, std::string* why) const;
  // A TLS caller by its certificate's common name: an administrator's, or a local user's.
  bool identify_certificate(const grpc::AuthContext& auth, Caller* out, std::string* why) const;
  int tcp_port() const { return tcp_port_; }

  // SIGHUP changed --allow-uid: the socket's mode follows (0666 when others may connect).
  void set_others_allowed(bool others) const {
    if (!path_.empty()) ::chmod(path_.c_str(), others ? 0666 : 0600);
  }

 private:
  void accept_loop();
  std::shared_ptr<grpc::AuthMetadataProcessor> certificate_gate();
  void open_unix_socket();   // binds and listens on path_; throws Error
  void close_unix_socket();  // closes and removes it, if open
  // The PEM file's text; throws Error naming the flag when it cannot be read.
  std::string read_pem(const std::string& file, const char* flag);

  AdminServerOptions options_;
  // Removed after the socket (the destructor's body), also when the constructor throws.
  CreatedFolders folders_;
  std::string path_;  // empty: no Unix socket
  SocketFile socket_file_;  // the socket bound at path_; removed by close_unix_socket()
  int tcp_port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that ends accept_loop
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  mutable Mutex mutex_;
  std::map<std::string, PeerCredentials> callers_ GS_GUARDED_BY(mutex_);  // by gRPC peer name
  // The connections handed to gRPC, by descriptor: whose, and the socket's inode, by which an
  // entry whose descriptor gRPC closed (or reused) is told from a live one. Accept thread only.
  struct Handed {
    uid_t uid = 0;
    ino_t inode = 0;
  };
  std::map<int, Handed> handed_;
  // How many live connections `uid` holds (pruning entries gRPC has closed since).
  size_t live_connections(uid_t uid);
  bool out_of_fds_logged_ = false;  // acceptor thread only
  LogThrottle refusals_;            // acceptor thread only
  // The TLS port's listener (tcp_listener.h); null without one. Stopped by the destructor
  // before the server shuts down.
  std::unique_ptr<TcpListener> tcp_listener_;
  std::thread acceptor_;

  static constexpr int kMaxThreads = 16;
  static constexpr int kMaxStreamsPerConnection = 4;
  static constexpr int kIdleMs = 60'000;
};

}  // namespace gradsync::admin
