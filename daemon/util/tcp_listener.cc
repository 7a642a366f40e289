#include "daemon/util/tcp_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "shared/host_port.h"
#include "shared/status.h"

namespace gradsync {
namespace {

// "ipv4:10.0.0.2:41234" as gRPC names peers; *host gets the part before the port, with every
// loopback address one host.
std::string describe(const sockaddr_storage& address, std::string* host) {
  char text[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    port = ntohs(in->sin_port);
    *host = std::string("ipv4:") + text;
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) *host = "loopback";
    return std::string("ipv4:") + text + ":" + std::to_string(port);
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
  ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
  port = ntohs(in6->sin6_port);
  const std::string name = std::string("ipv6:[") + text + "]";
  if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {  // an IPv4 peer on a dual-stack socket
    char v4[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], v4, sizeof v4);
    *host = in6->sin6_addr.s6_addr[12] == 127 ? "loopback" : std::string("ipv4:") + v4;
    return std::string("ipv4:") + v4 + ":" + std::to_string(port);
  }
  // One site holds a whole /64: that is the host, for the per-host bound.
  in6_addr prefix = in6->sin6_addr;
  std::memset(&prefix.s6_addr[8], 0, 8);
  char net[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, &prefix, net, sizeof net);
  *host = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ? "loopback" : std::string("ipv6:[") + net + "]/64";
  return name + ":" + std::to_string(port);
}

}  // namespace

TcpListener::TcpListener(const std::string& listen, TcpListenerLimits limits, Logger log, std::string service,
                         std::string option)
    : limits_(limits), log_(std::move(log)), service_(std::move(service)) {
  HostPort address;
  if (std::string why; !parse_host_port(listen, &address, &why)) {
    throw Error(Status::invalid_argument(option + " must be HOST:PORT, not '" + listen + "': " + why));
  }
  const std::string& host = address.host;
  const std::string port = std::to_string(address.port);
  // A wildcard listens on both families, as gRPC does: one IPv6 socket that takes IPv4 too.
  const bool wildcard = address.wildcard();
  std::string why = "no address";
  int chosen_port = 0;
  const auto bind_all = [&](int family) {
    addrinfo hints{};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (const int e = ::getaddrinfo(wildcard ? nullptr : host.c_str(), port.c_str(), &hints, &found); e != 0) {
      why = ::gai_strerror(e);
      return;
    }
    for (addrinfo* a = found; a; a = a->ai_next) {
      UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd.valid()) {
        why = std::strerror(errno);
        listen_fds_.clear();
        break;
      }
      // SO_REUSEADDR (a restarted daemon rebinds at once), never SO_REUSEPORT (a second
      // daemon on the port must be an error, not take half of the rendezvous traffic).
      const int one = 1, zero = 0;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (a->ai_family == AF_INET6) {
        ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, wildcard ? &zero : &one, sizeof one);
      }
      // Port 0 on a name with several addresses: the port the first got, on all of them.
      if (chosen_port != 0 && a->ai_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port = htons(static_cast<uint16_t>(chosen_port));
      }
      if (chosen_port != 0 && a->ai_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_port = htons(static_cast<uint16_t>(chosen_port));
      }
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
        why = std::strerror(errno);
        listen_fds_.clear();  // every address or none: a half-bound port would be a surprise
        break;
      }
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length);
      chosen_port = bound.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                                               : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      listen_fds_.push_back(std::move(fd));
    }
    ::freeaddrinfo(found);
  };
  bind_all(wildcard ? AF_INET6 : AF_UNSPEC);
  if (listen_fds_.empty() && wildcard) {  // no IPv6 here: IPv4 alone
    chosen_port = 0;
    bind_all(AF_INET);
  }
  if (listen_fds_.empty()) {
    throw Error(Status::internal("cannot serve the " + service_ + " on " + listen + ": " + why +
                                 " (address in use or invalid? see " + option + ")"));
  }
  port_ = chosen_port;
  // Well below the descriptor limit, so that the other sockets (the control socket first)
  // always have descriptors.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    limits_.max_total = std::max<size_t>(1, std::min<size_t>(limits_.max_total, files.rlim_cur / 4));
  }
  wake_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
}

TcpListener::~TcpListener() { stop(); }

void TcpListener::attach(grpc::ServerBuilder* builder, std::shared_ptr<grpc::ServerCredentials> credentials) {
  acceptor_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, std::move(credentials));
}

void TcpListener::start() { thread_ = std::thread([this] { accept_loop(); }); }

void TcpListener::stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)::write(wake_fd_.get(), &one, sizeof one);
    thread_.join();
  }
}

void TcpListener::proven(const std::string& grpc_peer) {
  // gRPC may write an IPv6 address's brackets percent-encoded.
  std::string peer = grpc_peer;
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"%5B", "["}, {"%5D", "]"}}) {
    for (size_t at = peer.find(from); at != std::string::npos; at = peer.find(from, at)) peer.replace(at, 3, to);
  }
  MutexLock lock(mutex_);
  auto it = by_peer_.find(peer);
  if (it == by_peer_.end()) return;
  auto handed = handed_.find(it->second);
  if (handed == handed_.end() || handed->second.proven) return;
  handed->second.proven = true;
  handed->second.hold.reset();
  uncount_unproven_locked(handed->second.host);
}

void TcpListener::uncount_unproven_locked(const std::string& host) {
  --unproven_;
  if (--unproven_by_host_[host] == 0) unproven_by_host_.erase(host);
}

void TcpListener::forget_locked(std::map<int, Handed>::iterator it) {
  if (!it->second.proven) uncount_unproven_locked(it->second.host);
  auto peer = by_peer_.find(it->second.peer);
  if (peer != by_peer_.end() && peer->second == it->first) by_peer_.erase(peer);
  handed_.erase(it);
}

void TcpListener::drop_locked(std::map<int, Handed>::iterator it) {
  // Shut down through this listener's own copy of the descriptor: gRPC, seeing the connection
  // end, closes its own. (gRPC's number may have been closed and reused meanwhile; the copy
  // cannot have been.)
  if (it->second.hold.valid()) ::shutdown(it->second.hold.get(), SHUT_RDWR);
  forget_locked(it);
}

void TcpListener::prune_locked() {
  last_prune_ = std::chrono::steady_clock::now();
  for (auto it = handed_.begin(); it != handed_.end();) {
    auto next = std::next(it);
    // gRPC closed it (or the number holds another socket now): a proven entry is forgotten;
    // an unproven one is shut down too, since its copy here still holds the socket open.
    struct stat st {};
    if (::fstat(it->first, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != it->second.inode) drop_locked(it);
    it = next;
  }
}

bool TcpListener::admit_locked(int fd, const std::string& host, const std::string& peer) {
  // A descriptor gRPC closed since may have come back as this one: drop the old entry.
  if (auto stale = handed_.find(fd); stale != handed_.end()) drop_locked(stale);
  // Unproven connections are held twice (gRPC's descriptor and this listener's copy).
  const auto over = [&]() GS_REQUIRES(mutex_) {
    auto h = unproven_by_host_.find(host);
    return handed_.size() + unproven_ + 2 > limits_.max_total ||
           (h != unproven_by_host_.end() && h->second >= limits_.max_per_host);
  };
  // Entries gRPC closed since are dropped only when they would refuse, and at most every
  // 100 ms: a descriptor's fstat costs, and a flood would ask on every accept.
  if (over() && std::chrono::steady_clock::now() - last_prune_ > std::chrono::milliseconds(100)) prune_locked();
  if (over()) {
    // An unproven connection makes way, of this host when the host is at its bound: one drawn
    // at random, so that a flood cannot count on closing a newcomer before it proves itself.
    const auto h = unproven_by_host_.find(host);
    const bool host_full = h != unproven_by_host_.end() && h->second >= limits_.max_per_host;
    auto chosen = handed_.end();
    size_t seen = 0;
    for (auto it = handed_.begin(); it != handed_.end(); ++it) {
      if (it->second.proven || (host_full && it->second.host != host)) continue;
      if (std::uniform_int_distribution<size_t>(0, seen++)(random_) == 0) chosen = it;
    }
    if (chosen == handed_.end()) return false;
    drop_locked(chosen);
    ++closed_.made_way;
  }
  UniqueFd hold(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!hold.valid()) return false;
  struct stat st {};
  handed_[fd] = Handed{host, peer, ::fstat(fd, &st) == 0 ? st.st_ino : 0, std::chrono::steady_clock::now(), false,
                       std::move(hold)};
  by_peer_[peer] = fd;
  ++unproven_by_host_[host];
  ++unproven_;
  return true;
}

void TcpListener::expire_unproven() {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(mutex_);
  for (auto it = handed_.begin(); it != handed_.end();) {
    auto next = std::next(it);
    if (!it->second.proven && now - it->second.accepted > limits_.proof_window) {
      drop_locked(it);
      ++closed_.unproven;
    }
    it = next;
  }
}

void TcpListener::log_closures(const std::string& last_peer) {
  const auto now = std::chrono::steady_clock::now();
  if (closed_.refused + closed_.made_way + closed_.unproven == 0 || now - last_log_ < std::chrono::seconds(1)) return;
  std::string text = service_ + ": closed";
  if (closed_.refused) {
    text += " " + std::to_string(closed_.refused) + " new connection(s) while every one held was proven,";
  }
  if (closed_.made_way) text += " " + std::to_string(closed_.made_way) + " unproven connection(s) to make way for newer,";
  if (closed_.unproven) {
    text += " " + std::to_string(closed_.unproven) + " connection(s) that made no authenticated call within " +
            std::to_string(limits_.proof_window.count()) + " ms,";
  }
  if (!last_peer.empty()) text += " the last newcomer from " + last_peer + ",";
  log_.warning(text + " at most " + std::to_string(limits_.max_per_host) + " unproven per host and " +
               std::to_string(limits_.max_total) + " in all");
  last_log_ = now;
  closed_ = {};
}

void TcpListener::accept_loop() {
  auto last_expiry = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_.get(), POLLIN, 0}};
    for (const UniqueFd& l : listen_fds_) fds.push_back({l.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 250) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (fds[0].revents) return;
    if (std::chrono::steady_clock::now() - last_expiry >= std::chrono::milliseconds(250)) {
      expire_unproven();
      last_expiry = std::chrono::steady_clock::now();
    }
    for (size_t ready = 1; ready < fds.size(); ++ready) {
      if (!(fds[ready].revents & POLLIN)) continue;
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      const int fd =
          ::accept4(fds[ready].fd, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        // Out of descriptors (or any other failure): the connection stays queued; pause, retry.
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        continue;
      }
      std::string host;
      const std::string peer = describe(address, &host);
      bool admitted = false;
      {
        MutexLock lock(mutex_);
        admitted = admit_locked(fd, host, peer);
      }
      if (!admitted) {
        ::close(fd);
        ++closed_.refused;
        log_closures(peer);
        continue;
      }
      const int one = 1;  // as gRPC sets on the connections it accepts itself
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
      connection.listener_fd = fds[ready].fd;
      connection.fd = fd;
      acceptor_->HandleNewConnection(&connection);  // gRPC owns fd from here
      log_closures(peer);
    }
    log_closures({});
  }
}

}  // namespace gradsync
