#include "daemon/admin/admin_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "daemon/admin/admin_service.h"

namespace gradsync::admin {
namespace {

Status fail(const std::string& path, const std::string& what) {
  return Status::internal("admin socket " + path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

AdminServer::AdminServer(AdminServerOptions options) : options_(std::move(options)) {
  static constexpr char kUnix[] = "unix:";
  if (options_.address.rfind(kUnix, 0) != 0) {
    throw Error(Status::invalid_argument("--admin must be unix:PATH (TCP with mTLS is not there yet), not '" +
                                         options_.address + "'"));
  }
  path_ = options_.address.substr(sizeof kUnix - 1);
  sockaddr_un address{};
  if (path_.empty() || path_.size() >= sizeof address.sun_path) {
    throw Error(Status::invalid_argument("--admin: the socket path '" + path_ + "' is empty or too long"));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path_.c_str(), path_.size() + 1);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw Error(fail(path_, "socket"));
  // A stale socket from a daemon that died is replaced; one a live daemon serves is not.
  if (::connect(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    ::close(listen_fd_);
    throw Error(Status::already_exists("admin socket " + path_ + " is served by a running gradsyncd"));
  }
  ::close(listen_fd_);
  struct stat existing {};
  if (::lstat(path_.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      throw Error(Status::already_exists("admin socket " + path_ + ": something that is not a socket is there"));
    }
    ::unlink(path_.c_str());  // a stale socket of a daemon that died
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) throw Error(fail(path_, "socket"));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    const Status status = fail(path_, "bind");
    ::close(listen_fd_);
    throw Error(status);
  }
  // Each call is judged by the caller's uid (SO_PEERCRED); the mode only keeps out those who
  // could never be allowed, as the control socket's does.
  ::chmod(path_.c_str(), options_.others_allowed ? 0666 : 0600);
  if (::listen(listen_fd_, 64) != 0) {
    const Status status = fail(path_, "listen");
    ::close(listen_fd_);
    throw Error(status);
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const Status status = fail(path_, "eventfd");
    ::close(listen_fd_);
    ::unlink(path_.c_str());
    throw Error(status);
  }
  service_ = std::make_unique<AdminService>(
      options_.view, [this](const std::string& peer, PeerCredentials* out) { return caller(peer, out); });
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  // Bounds on what callers can hold of the daemon: threads for calls, streams per connection,
  // and idle connections (only allowed users get this far: see accept_loop()).
  grpc::ResourceQuota quota("gradsync-admin");
  quota.SetMaxThreads(kMaxThreads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kIdleMs);
  server_ = builder.BuildAndStart();
  if (!server_) {
    ::close(listen_fd_);
    ::close(wake_fd_);
    ::unlink(path_.c_str());
    throw Error(Status::internal("admin socket " + path_ + ": the gRPC server did not start"));
  }
  acceptor_ = std::thread([this] { accept_loop(); });
  options_.log.info("admin service listening on " + options_.address);
}

AdminServer::~AdminServer() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)::write(wake_fd_, &one, sizeof one);
  if (acceptor_.joinable()) acceptor_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  ::unlink(path_.c_str());
}

bool AdminServer::caller(const std::string& peer, PeerCredentials* out) const {
  std::lock_guard lock(mutex_);
  auto it = callers_.find(peer);
  if (it == callers_.end()) return false;
  *out = it->second;
  return true;
}

void AdminServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      options_.log.error("admin socket " + path_ + ": poll: " + std::strerror(errno) + "; no more admin connections");
      return;
    }
    if (fds[1].revents) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        // Out of descriptors: the pending connection stays queued; retrying at once would spin.
        if (!out_of_fds_logged_) options_.log.warning("admin socket: out of file descriptors; pausing accepts");
        out_of_fds_logged_ = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    out_of_fds_logged_ = false;
    PeerCredentials who;
    if (!read_peer_credentials(fd, &who).ok()) {
      ::close(fd);
      continue;
    }
    // Users the daemon does not allow get nothing, health and reflection included: the
    // connection closes at once.
    if (!options_.view->allowed(who.uid)) {
      options_.log.info("admin socket: uid " + std::to_string(who.uid) + " (pid " + std::to_string(who.pid) +
                        ") is not allowed; connection closed");
      ::close(fd);
      continue;
    }
    {
      // gRPC names a connection it was handed by descriptor "fd:N"; a number is reused only
      // after its connection closed, so the entry is replaced before anyone can look it up.
      std::lock_guard lock(mutex_);
      callers_["fd:" + std::to_string(fd)] = who;
    }
    grpc::AddInsecureChannelFromFd(server_.get(), fd);
  }
}

}  // namespace gradsync::admin
