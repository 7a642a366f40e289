#include "daemon/admin/admin_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/grpc_security_constants.h>
#include <pwd.h>

#include <algorithm>
#include <functional>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "daemon/admin/admin_service.h"
#include "daemon/control/socket_path.h"

namespace gradsync::admin {
namespace {

Status fail(const std::string& path, const std::string& what) {
  return Status::internal("admin socket " + path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

AdminServer::AdminServer(AdminServerOptions options) : options_(std::move(options)) {
  if (options_.connections_total == 0) {
    rlimit files{};
    const size_t limit = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                             ? static_cast<size_t>(files.rlim_cur)
                             : 8192;
    options_.connections_total = std::max<size_t>(options_.connections_per_user, std::min<size_t>(1024, limit / 8));
  }
  static constexpr char kUnix[] = "unix:";
  if (options_.address != "none") {
    if (options_.address.rfind(kUnix, 0) != 0) {
      throw Error(Status::invalid_argument("--admin must be unix:PATH, none or HOST:PORT, not '" + options_.address + "'"));
    }
    path_ = options_.address.substr(sizeof kUnix - 1);
    open_unix_socket();
  }
  service_ = std::make_unique<AdminService>(
      options_.view,
      [this](grpc::ServerContext* context, Caller* out, std::string* why) { return caller(context, out, why); },
      options_.log);
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
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use is an error, not shared
  if (!options_.tcp.address.empty()) {
    const AdminTls& tls = options_.tcp;
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = read_pem(tls.ca_file, "--admin-tls-ca");
    ssl.pem_key_cert_pairs.push_back({read_pem(tls.key_file, "--admin-tls-key"), read_pem(tls.cert_file, "--admin-tls-cert")});
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(ssl);
    credentials->SetAuthMetadataProcessor(certificate_gate());
    // Accepted by the daemon and handed to gRPC, bounded: an unauthenticated flood cannot take
    // the descriptors trainers need (tcp_listener.h).
    try {
      tcp_listener_ = std::make_unique<TcpListener>(tls.address, TcpListenerLimits{256, 16, std::chrono::seconds(5)},
                                                    options_.log, "admin service", "--admin");
    } catch (const Error&) {
      close_unix_socket();
      throw;
    }
    tcp_port_ = tcp_listener_->port();
    tcp_listener_->attach(&builder, credentials);
  }
  server_ = builder.BuildAndStart();
  if (server_ && tcp_listener_) tcp_listener_->start();
  if (!server_ || (!options_.tcp.address.empty() && tcp_port_ == 0)) {
    close_unix_socket();
    throw Error(Status::internal(options_.tcp.address.empty()
                                     ? "admin socket " + path_ + ": the gRPC server did not start"
                                     : "admin service: cannot listen on " + options_.tcp.address +
                                           " with TLS (address in use or invalid, or a certificate or key gRPC "
                                           "refused: see the log above)"));
  }
  if (!path_.empty()) {
    acceptor_ = std::thread([this] { accept_loop(); });
    options_.log.info("admin service listening on " + options_.address);
  }
  if (!options_.tcp.address.empty()) {
    options_.log.info("admin service listening on " + options_.tcp.address + " (TCP port " + std::to_string(tcp_port_) +
                      ", mutual TLS)");
  }
}

std::string AdminServer::read_pem(const std::string& file, const char* flag) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || text.str().find("-----BEGIN ") == std::string::npos) {
    close_unix_socket();
    throw Error(Status::invalid_argument(std::string(flag) + ": cannot read a PEM file at '" + file + "'"));
  }
  return text.str();
}

void AdminServer::open_unix_socket() {
  if (Status status = check_socket_folder(path_, "admin socket", folders_); !status.ok()) throw Error(status);
  sockaddr_un address{};
  if (path_.empty() || path_.size() >= sizeof address.sun_path) {
    throw Error(Status::invalid_argument("--admin: the socket path '" + path_ + "' is empty or too long"));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path_.c_str(), path_.size() + 1);
  {
    // A stale socket from a daemon that died is replaced; one a live daemon serves is not.
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) throw Error(fail(path_, "socket"));
    const bool served = ::connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(probe);
    if (served) throw Error(Status::already_exists("admin socket " + path_ + " is served by a running gradsyncd"));
  }
  struct stat existing {};
  if (::lstat(path_.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      throw Error(Status::already_exists("admin socket " + path_ + ": something that is not a socket is there"));
    }
    ::unlink(path_.c_str());  // a stale socket of a daemon that died
  }
  // Each call is judged by the caller's uid (SO_PEERCRED); the mode only keeps out those who
  // could never be allowed, as the control socket's does.
  Status status;
  listen_fd_ = bind_unix_socket(path_, options_.others_allowed ? 0666 : 0600, 64, true, &status);
  if (listen_fd_ < 0) throw Error(Status::internal("admin socket " + status.message()));
  socket_file_.bound(path_);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const Status status = fail(path_, "eventfd");
    close_unix_socket();
    throw Error(status);
  }
}

void AdminServer::close_unix_socket() {
  socket_file_.remove();  // while it still listens (owned_paths.h)
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

AdminServer::~AdminServer() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)::write(wake_fd_, &one, sizeof one);
  if (acceptor_.joinable()) acceptor_.join();
  if (tcp_listener_) tcp_listener_->stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  close_unix_socket();
}

bool AdminServer::identify_certificate(const grpc::AuthContext& auth, Caller* out, std::string* why) const {
  const auto names = auth.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (names.empty()) {
    *why = "the client certificate has no common name";
    return false;
  }
  out->certificate = std::string(names.front().data(), names.front().size());
  // A user name, nothing else: no NUL (which getpwnam would stop at), no control characters.
  const bool plain = !out->certificate.empty() && out->certificate.size() <= 64 &&
                     out->certificate.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                        "0123456789._-") == std::string::npos;
  if (!plain) {
    *why = "the client certificate's common name is not a plain user name";
    return false;
  }
  const auto& admins = options_.tcp.admin_cns;
  out->admin_certificate = std::find(admins.begin(), admins.end(), out->certificate) != admins.end();
  if (out->admin_certificate) return true;
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(static_cast<size_t>(size > 0 ? size : 16384));
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwnam_r(out->certificate.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found) {
    *why = "client certificate '" + out->certificate +
           "' names no user of this node and is not an administrator's (gradsyncd --admin-tls-admin-cn)";
    return false;
  }
  out->uid = found->pw_uid;
  return true;
}

bool AdminServer::caller(grpc::ServerContext* context, Caller* out, std::string* why) const {
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  // TCP: gRPC verified the certificate against the CA; its common name says who it is.
  if (auth && auth->IsPeerAuthenticated()) {
    if (!identify_certificate(*auth, out, why)) return false;
    if (tcp_listener_) tcp_listener_->proven(context->peer());  // the connection stays
    return true;
  }
  MutexLock lock(mutex_);
  auto it = callers_.find(context->peer());
  if (it == callers_.end()) {
    *why = "the admin service could not identify this connection";
    return false;
  }
  out->uid = it->second.uid;
  return true;
}

namespace {

// Over TCP, every call (health and reflection too) first passes this: the certificate must be
// an administrator's or name a local user the daemon allows, as the Unix socket admits only
// allowed users at all.
class CertificateGate final : public grpc::AuthMetadataProcessor {
 public:
  using Admit = std::function<bool(const grpc::AuthContext&, std::string*)>;
  explicit CertificateGate(Admit admit) : admit_(std::move(admit)) {}
  bool IsBlocking() const override { return true; }  // user lookups may block (NSS)
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*, OutputMetadata*) override {
    std::string why;
    if (!admit_(*context, &why)) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
    return grpc::Status::OK;
  }

 private:
  Admit admit_;
};

}  // namespace

std::shared_ptr<grpc::AuthMetadataProcessor> AdminServer::certificate_gate() {
  return std::make_shared<CertificateGate>([this](const grpc::AuthContext& auth, std::string* why) {
    Caller who;
    if (!identify_certificate(auth, &who, why)) return false;
    if (!who.admin_certificate && !options_.view->allowed(who.uid)) {
      *why = "certificate '" + who.certificate + "' (uid " + std::to_string(who.uid) +
             ") is not allowed on this gradsyncd (gradsyncd --allow-uid; default: its own user and root)";
      return false;
    }
    return true;
  });
}

size_t AdminServer::live_connections(uid_t uid) {
  size_t live = 0;
  for (auto it = handed_.begin(); it != handed_.end();) {
    // Still the socket handed over: same descriptor, same inode. (gRPC closed it otherwise; the
    // number may hold something else now, or nothing.)
    struct stat st {};
    if (::fstat(it->first, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != it->second.inode) {
      it = handed_.erase(it);
      continue;
    }
    if (it->second.uid == uid) ++live;
    ++it;
  }
  return live;
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
      refusals_.note(options_.log, LogLevel::kInfo,
                     "admin socket: uid " + std::to_string(who.uid) + " (pid " + std::to_string(who.pid) +
                         ") is not allowed; connection closed");
      ::close(fd);
      continue;
    }
    if (live_connections(who.uid) >= options_.connections_per_user) {
      refusals_.note(options_.log, LogLevel::kWarning,
                     "admin socket: uid " + std::to_string(who.uid) + " (pid " + std::to_string(who.pid) +
                         ") already holds " + std::to_string(options_.connections_per_user) +
                         " admin connections, the limit per user; connection closed");
      ::close(fd);
      continue;
    }
    // Root and the daemon's own user are held to their own 16 only: a crowd of allowed users
    // never locks the operator out.
    const bool operator_uid = who.uid == 0 || who.uid == ::geteuid();
    if (!operator_uid && handed_.size() >= options_.connections_total) {  // (pruned by live_connections above)
      refusals_.note(options_.log, LogLevel::kWarning,
                     "admin socket: " + std::to_string(handed_.size()) +
                         " admin connections are open, the limit for all users together; uid " +
                         std::to_string(who.uid) + " (pid " + std::to_string(who.pid) + ") closed");
      ::close(fd);
      continue;
    }
    {
      // gRPC names a connection it was handed by descriptor "fd:N"; a number is reused only
      // after its connection closed, so the entry is replaced before anyone can look it up.
      MutexLock lock(mutex_);
      callers_["fd:" + std::to_string(fd)] = who;
    }
    struct stat st {};
    handed_[fd] = Handed{who.uid, ::fstat(fd, &st) == 0 ? st.st_ino : 0};
    grpc::AddInsecureChannelFromFd(server_.get(), fd);
  }
}

}  // namespace gradsync::admin
