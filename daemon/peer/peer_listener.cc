#include "daemon/peer/peer_listener.h"

#include <arpa/inet.h>
#include <grpcpp/server_posix.h>
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

PeerListener::PeerListener(const std::string& listen, PeerListenerLimits limits, Logger log)
    : limits_(limits), log_(std::move(log)) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw Error(Status::invalid_argument("--peer-listen must be HOST:PORT, not '" + listen + "'"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = listen.substr(colon + 1);
  // A wildcard listens on both families, as gRPC does: one IPv6 socket that takes IPv4 too.
  const bool wildcard = host == "0.0.0.0" || host == "::" || host == "*";
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
    throw Error(Status::internal("cannot serve the peer service on " + listen + ": " + why +
                                 " (address in use or invalid? see --peer-listen)"));
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

PeerListener::~PeerListener() { stop(); }

void PeerListener::stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)::write(wake_fd_.get(), &one, sizeof one);
    thread_.join();
  }
}

void PeerListener::start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { accept_loop(); });
}

std::string PeerListener::peer_of(const std::string& grpc_peer) const {
  if (grpc_peer.rfind("fd:", 0) != 0) return grpc_peer;
  int fd = -1;
  try {
    fd = std::stoi(grpc_peer.substr(3));
  } catch (const std::exception&) {
    return grpc_peer;
  }
  std::lock_guard lock(mutex_);
  auto it = handed_.find(fd);
  return it == handed_.end() ? grpc_peer : it->second.peer;
}

void PeerListener::prune_locked() {
  for (auto it = handed_.begin(); it != handed_.end();) {
    // Still the socket handed over: same descriptor, same inode (gRPC closed it otherwise).
    struct stat st {};
    if (::fstat(it->first, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != it->second.inode) {
      it = handed_.erase(it);
    } else {
      ++it;
    }
  }
}

void PeerListener::accept_loop() {
  auto last_refusal_log = std::chrono::steady_clock::time_point{};
  size_t refused_since_log = 0;
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_.get(), POLLIN, 0}};
    for (const UniqueFd& l : listen_fds_) fds.push_back({l.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (fds[0].revents) return;
    size_t ready = 1;
    while (ready < fds.size() && !(fds[ready].revents & POLLIN)) ++ready;
    if (ready == fds.size()) continue;
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd = ::accept4(fds[ready].fd, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors (or any other failure): the connection stays queued; pause, retry.
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    std::string host;
    const std::string peer = describe(address, &host);
    bool refuse = false;
    {
      std::lock_guard lock(mutex_);
      const auto over = [&] {
        size_t from_host = 0;
        for (const auto& [handed_fd, h] : handed_) from_host += h.host == host;
        return handed_.size() >= limits_.max_total || from_host >= limits_.max_per_host;
      };
      // Entries gRPC closed since are dropped only when they would refuse: a descriptor's
      // fstat costs, and the lock is the one peer_of() takes.
      refuse = over();
      if (refuse) {
        prune_locked();
        refuse = over();
      }
      if (!refuse) {
        struct stat st {};
        handed_[fd] = Handed{host, peer, ::fstat(fd, &st) == 0 ? st.st_ino : 0};
      }
    }
    if (refuse) {
      ::close(fd);
      ++refused_since_log;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_refusal_log >= std::chrono::seconds(1)) {
        log_.warning("peer service: closed " + std::to_string(refused_since_log) + " connection(s), the last from " +
                     peer + ": at most " + std::to_string(limits_.max_per_host) + " per host and " +
                     std::to_string(limits_.max_total) + " in all");
        last_refusal_log = now;
        refused_since_log = 0;
      }
      continue;
    }
    const int one = 1;  // as gRPC sets on the connections it accepts itself
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    grpc::AddInsecureChannelFromFd(server_, fd);
  }
}

}  // namespace gradsync
