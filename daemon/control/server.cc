#include "daemon/control/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/control/session.h"
#include "daemon/control/socket_path.h"

namespace gradsync {

namespace asio = boost::asio;
using Protocol = asio::local::stream_protocol;

namespace {

// A socket file left by a crashed daemon is removed; one a live daemon serves is not. The folder
// must be safe first (socket_path.h), or the "stale socket" could be anyone's.
void claim_socket_path(asio::io_context& io, const std::string& path, CreatedFolders& created) {
  if (Status status = check_socket_folder(path, "control socket", created); !status.ok()) throw Error(status);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISSOCK(st.st_mode)) {
    throw Error(Status::already_exists("control socket path " + path + " exists and is not a socket"));
  }
  Protocol::socket probe(io);
  boost::system::error_code ec;
  probe.connect(Protocol::endpoint(path), ec);
  if (!ec) throw Error(Status::already_exists("another gradsyncd is already serving " + path));
  ::unlink(path.c_str());
}

}  // namespace

ControlServer::ControlServer(asio::io_context& io, ControlServerOptions options)
    : options_(std::move(options)), acceptor_(io) {
  // Without them every import would run on the io thread, and no user limit would hold.
  if (!options_.context.registry || !options_.context.backends || !options_.context.setup || !options_.context.users) {
    throw Error(Status::internal("the control server needs its registry, backends, setup threads and user counts"));
  }
  claim_socket_path(io, options_.socket_path, folders_);
  // The allow-list is what authenticates; the file mode only keeps strangers from even trying.
  Status status;
  const int fd = bind_unix_socket(options_.socket_path, options_.allowed_uids.empty() ? 0600 : 0666,
                                  asio::socket_base::max_listen_connections, false, &status);
  if (fd < 0) throw Error(Status::internal("cannot listen on " + options_.socket_path + ": " + status.message()));
  socket_file_.bound(options_.socket_path);
  boost::system::error_code ec;
  acceptor_.assign(Protocol(), fd, ec);
  if (ec) {
    socket_file_.remove();
    ::close(fd);
    throw Error(Status::internal("cannot listen on " + options_.socket_path + ": " + ec.message()));
  }
  options_.log.info("listening on " + options_.socket_path);
}

ControlServer::~ControlServer() { stop(Status::aborted("gradsyncd is shutting down")); }

void ControlServer::set_allowed_uids(std::vector<uid_t> uids) {
  options_.allowed_uids = std::move(uids);
  ::chmod(options_.socket_path.c_str(), options_.allowed_uids.empty() ? 0600 : 0666);  // as at start
}

std::vector<ClientInfo> ControlServer::clients() const {
  std::vector<ClientInfo> out;
  for (const auto& weak : sessions_) {
    if (auto session = weak.lock()) {
      if (auto info = session->info()) out.push_back(std::move(*info));
    }
  }
  return out;
}

void ControlServer::start() {
  asio::co_spawn(acceptor_.get_executor(), [this]() { return accept_loop(); }, asio::detached);
}

void ControlServer::stop(const Status& why) {
  // The name goes first, while the socket still listens (owned_paths.h).
  socket_file_.remove();
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  for (auto& weak : sessions_) {
    if (auto session = weak.lock()) session->stop(why);
  }
  sessions_.clear();
}

bool ControlServer::allowed(uid_t uid) const {
  if (options_.allowed_uids.empty()) return uid == ::geteuid() || uid == 0;
  return std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), uid) != options_.allowed_uids.end();
}

asio::awaitable<void> ControlServer::accept_loop() {
  while (acceptor_.is_open()) {
    boost::system::error_code ec;
    Protocol::socket socket = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) break;
    if (ec) {
      // EMFILE and friends: log and keep serving the connections we have.
      options_.log.error("accept failed: " + ec.message());
      asio::steady_timer pause(acceptor_.get_executor(), std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    PeerCredentials peer;
    if (Status status = read_peer_credentials(socket.native_handle(), &peer); !status.ok()) {
      options_.log.error(status.message());
      continue;
    }
    SessionOptions session_options;
    session_options.context = options_.context;
    session_options.log = options_.log;
    session_options.connection_timeout = options_.connection_timeout;
    // A user's connections are bounded, so one user cannot take every descriptor; a refused
    // connection is told why and closed at once (it holds no ticket).
    Status refused;
    if (!allowed(peer.uid)) {
      refused = Status::permission_denied("uid " + std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) +
                                          ") is not allowed to use this daemon (see --allow-uid)");
    } else {
      refused = options_.context.users->take(UserCounts::What::kConnections, peer.uid, 1, &session_options.connection);
    }
    auto session = std::make_shared<Session>(std::move(socket), peer, std::move(session_options));
    session->start();
    std::erase_if(sessions_, [](const std::weak_ptr<Session>& s) { return s.expired(); });
    sessions_.push_back(session);
    if (!refused.ok()) {
      // Anyone who can reach the socket can connect as fast as they like: one line a second.
      refused_connections_.note(options_.log, LogLevel::kWarning, "closing connection: " + refused.to_string());
      session->refuse(refused, /*logged=*/true);
    }
  }
}

}  // namespace gradsync
