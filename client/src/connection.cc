#include "client/src/connection.h"

#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "shared/fd_passing.h"
#include "shared/socket_names.h"

namespace gradsync {
namespace {

// The first complete frame in `frames` that is a parting notice (an error reply with id 0),
// consuming the frames before it.
std::optional<Status> first_notice(FrameDecoder& frames) {
  for (;;) {
    std::optional<std::string> payload;
    if (!frames.next(&payload).ok() || !payload) return std::nullopt;
    control::Reply reply;
    if (reply.ParseFromString(*payload) && reply.id() == 0 && reply.has_error() && reply.error().code() != 0) {
      return Status(static_cast<ErrorCode>(reply.error().code()), reply.error().message());
    }
  }
}

}  // namespace

namespace {

// The packaged service runs as the system user "gradsync" (systemd/gradsync.sysusers), on a
// socket in /run/gradsync, which only root makes. Only root makes a system user, so a daemon
// running as it there is as trusted as one running as root; anywhere else it is not.
bool is_service_user(uid_t uid, const std::string& socket_path) {
  if (socket_path.rfind("/run/gradsync/", 0) != 0) return false;
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(4096);
  return ::getpwnam_r("gradsync", &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr &&
         found->pw_uid == uid && found->pw_uid < 1000;
}

}  // namespace

Connection::Connection(const std::string& socket_path, std::optional<uid_t> daemon_uid) : path_(socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(address.sun_path)) {
    throw Error(Status::invalid_argument("control socket path '" + socket_path + "' is empty or too long"));
  }
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw Error(Status::internal(std::string("socket() failed: ") + std::strerror(errno)));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    // Not being allowed is no lost peer: say who decides, rather than "is the daemon running?".
    if (err == EACCES || err == EPERM) {
      throw Error(Status::permission_denied(
          "cannot connect to gradsyncd at " + socket_path + ": permission denied for uid " +
          std::to_string(::geteuid()) + ": gradsyncd admits only the users it allows (its --allow-uid flag, or "
          "allow-uid in gradsyncd.toml; by default its own user and root); ask its operator to add uid " +
          std::to_string(::geteuid()) + ", or run a daemon of your own (gradsyncd --socket PATH)"));
    }
    throw Error(Status::peer_lost("cannot connect to gradsyncd at " + socket_path + ": " + std::strerror(err) +
                                  " (is the daemon running? set GRADSYNC_SOCKET or ConnectOptions::socket_path)"));
  }
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error(Status::internal("SO_PEERCRED on " + socket_path + " failed: " + std::strerror(err)));
  }
  const bool trusted = peer.uid == 0 || peer.uid == ::geteuid() || (daemon_uid && peer.uid == *daemon_uid) ||
                       is_service_user(peer.uid, socket_path);
  if (!trusted) {
    ::close(fd_);
    fd_ = -1;
    throw Error(Status::permission_denied(
        "the process serving " + socket_path + " (pid " + std::to_string(peer.pid) + ") runs as uid " +
        std::to_string(peer.uid) + ", which is neither root, this process's uid " + std::to_string(::geteuid()) +
        ", nor the daemon uid this client trusts" +
        (daemon_uid ? " (" + std::to_string(*daemon_uid) + ")" : std::string()) +
        "; if gradsyncd runs as that user, set GRADSYNC_DAEMON_UID=" + std::to_string(peer.uid) +
        " or ConnectOptions::daemon_uid"));
  }
}

Status Connection::explain_foreign(const Status& read) const {
  if (read.message().rfind(kSpeaksGrpcServer, 0) != 0) return read;
  const std::string control = control_socket_for(path_);
  return Status::invalid_argument(
      path_ + " is not gradsyncd's control socket: it speaks HTTP/2 (gRPC), as gradsyncd's admin socket (for "
      "gradsyncctl) does. Point GRADSYNC_SOCKET (Python: connect(socket=...), C++: ConnectOptions::socket_path) at "
      "the control socket" + (control.empty() ? std::string(" (gradsyncd's --socket)") : ": " + control));
}

Connection::~Connection() {
  if (fd_ >= 0) ::close(fd_);
}

void Connection::write_all(const std::string& bytes, std::span<const int> fds) {
  size_t done = 0;
  while (done < bytes.size()) {
    // The descriptors travel with the frame's first bytes, in one sendmsg().
    const ssize_t n = send_with_fds(fd_, std::as_bytes(std::span<const char>(bytes.data() + done, bytes.size() - done)),
                                    done == 0 ? fds : std::span<const int>(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      if (std::optional<Status> notice = notice_after_failed_write()) throw Error(*notice);
      throw Error(Status::peer_lost("lost the connection to gradsyncd at " + path_ + ": " + std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
}

// The daemon speaks unprompted only right before it closes: a refusal (a user it does not
// allow, a connection over the user's limit) or a shutdown notice. It stops receiving first,
// which is what failed our write, and writes the notice after, then closes; so the notice may
// already be decoded (read with an earlier reply), be waiting on the socket, or be on its way.
// Waiting for the daemon's close (bounded: the connection is lost either way) lets it arrive;
// the notice says why, where "broken pipe" does not.
std::optional<Status> Connection::notice_after_failed_write() {
  if (std::optional<Status> notice = first_notice(decoder_)) return notice;
  constexpr int kCloseWaitMs = 1000;
  pollfd p{fd_, POLLRDHUP, 0};
  ::poll(&p, 1, kCloseWaitMs);
  return parting_notice();
}

void Connection::shut_down(const Status& why) {
  if (shut_why_->set(why)) ::shutdown(fd_, SHUT_RDWR);
}

control::Reply Connection::call(control::Request request, std::chrono::milliseconds timeout, std::span<const int> fds,
                                std::vector<UniqueFd>* reply_fds) {
  // A call that shut_down() interrupts fails with the transport's error: say why instead.
  try {
    return call_once(std::move(request), timeout, fds, reply_fds);
  } catch (const Refused&) {
    throw;
  } catch (const Error&) {
    if (std::optional<Status> why = shut_down_reason()) throw Error(*why);
    throw;
  }
}

control::Reply Connection::call_once(control::Request request, std::chrono::milliseconds timeout,
                                     std::span<const int> fds, std::vector<UniqueFd>* reply_fds) {
  if (std::optional<Status> why = shut_down_reason()) throw Error(*why);
  const uint64_t id = next_id_++;
  request.set_id(id);
  request.set_fd_count(static_cast<uint32_t>(fds.size()));
  write_all(encode_frame(request.SerializeAsString()), fds);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::optional<std::string> payload;
    if (Status read = decoder_.next(&payload); !read.ok()) throw Error(explain_foreign(read));
    if (payload) {
      control::Reply reply;
      if (!reply.ParseFromString(*payload)) throw Error(Status::protocol("gradsyncd sent an unparsable reply"));
      if (reply.fd_count() > received_fds_.size()) {
        throw Error(Status::protocol("gradsyncd sent a reply naming " + std::to_string(reply.fd_count()) +
                                     " file descriptors, but only " + std::to_string(received_fds_.size()) +
                                     " arrived"));
      }
      std::vector<UniqueFd> mine;
      for (uint32_t i = 0; i < reply.fd_count(); ++i) {
        mine.push_back(std::move(received_fds_.front()));
        received_fds_.pop_front();
      }
      if (reply.id() != id && reply.id() != 0) continue;  // a stale reply to an abandoned call; its fds close
      if (reply.has_error() && reply.error().code() != 0) {
        Status error(static_cast<ErrorCode>(reply.error().code()), reply.error().message());
        // Id 0 is the daemon's parting notice (it is closing the connection), not an answer to
        // this call, which it may have carried out.
        if (reply.id() == id) throw Refused(std::move(error));
        throw Error(std::move(error));
      }
      if (reply_fds) *reply_fds = std::move(mine);
      return reply;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw Error(Status::timeout("gradsyncd did not answer within " + std::to_string(timeout.count()) + " ms"));
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1'000'000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    std::byte buffer[64 << 10];
    Received got;
    const ssize_t n = receive_with_fds(fd_, buffer, 0, &got);
    if (n < 0 && errno == EINTR) continue;
    for (auto& fd : got.fds) received_fds_.push_back(std::move(fd));
    if (n <= 0) {
      throw Error(Status::peer_lost("gradsyncd at " + path_ + " closed the connection" +
                                    (n < 0 ? std::string(": ") + std::strerror(errno) : std::string())));
    }
    decoder_.feed(std::span<const std::byte>(buffer, static_cast<size_t>(n)));
  }
}

bool Connection::peer_closed() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  // The daemon speaks unprompted only right before it closes (a shutdown notice), so a hang-up,
  // or readable-with-nothing-to-read, means end of stream.
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char byte;
  return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

std::optional<Status> Connection::parting_notice() const {
  std::vector<std::byte> buffer(64 << 10);
  const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n <= 0) return std::nullopt;
  FrameDecoder frames;
  frames.feed(std::span<const std::byte>(buffer.data(), static_cast<size_t>(n)));
  return first_notice(frames);
}

}  // namespace gradsync
