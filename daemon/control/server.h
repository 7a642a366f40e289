// The control server: accepts clients on the Unix socket, authenticates them with SO_PEERCRED
// against the allow-list, and starts a Session for each. Owns the socket file: refuses to start
// when another daemon serves it, replaces a stale one, and removes it on destruction, with the
// folders it created for it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/control/asio.h"
#include "daemon/backend/factory.h"
#include "daemon/util/local_limits.h"
#include "daemon/util/setup_threads.h"
#include "daemon/control/client_report.h"
#include "daemon/control/context.h"
#include "daemon/control/owned_paths.h"
#include "daemon/job/registry.h"
#include "daemon/util/log.h"

namespace gradsync {

struct ControlServerOptions {
  std::string socket_path;
  std::vector<uid_t> allowed_uids;  // empty: this process's uid and root
  ControlContext context;           // its setup threads and user counts are required here
  Logger log;
  std::chrono::milliseconds connection_timeout{60'000};  // see SessionOptions
};

class ControlServer {
 public:
  // Binds and listens; throws Error naming the path and the cause on failure.
  ControlServer(boost::asio::io_context& io, ControlServerOptions options);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  void start();

  // Every live client, for the admin service. On the io thread.
  std::vector<ClientInfo> clients() const;

  // SIGHUP: the users allowed from now on (connected clients stay). On the io thread.
  void set_allowed_uids(std::vector<uid_t> uids);
  // Stops accepting and ends every session (its job learns `why`); the io_context then runs out
  // of work.
  void stop(const Status& why);

 private:
  boost::asio::awaitable<void> accept_loop();
  bool allowed(uid_t uid) const;

  ControlServerOptions options_;
  // Removed after the socket (the destructor's body), also when the constructor throws.
  CreatedFolders folders_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  SocketFile socket_file_;  // removed by stop(), before the acceptor closes
  std::vector<std::weak_ptr<class Session>> sessions_;  // for shutdown; expired ones are pruned
  LogThrottle refused_connections_;  // the acceptor's (io thread)
};

}  // namespace gradsync
