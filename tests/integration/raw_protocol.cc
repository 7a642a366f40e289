#include "tests/integration/raw_protocol.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "shared/fd_passing.h"
#include "shared/framing.h"
#include "shared/version.h"

namespace gradsync::test {

RawJoin raw_join(Connection& raw, const std::string& job, int world, int rank) {
  control::Request hello;
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  raw.call(hello, std::chrono::seconds(5));
  control::Request join_request;
  auto* j = join_request.mutable_join();
  j->set_job_id(job);
  j->set_rank(rank);
  j->set_local_rank(rank);
  j->set_world_size(world);
  j->set_local_world_size(world);
  RawJoin joined;
  joined.reply = raw.call(join_request, std::chrono::seconds(10), {}, &joined.fds);
  REQUIRE(joined.fds.size() == kJoinFdCount);
  REQUIRE(map_fd(joined.fds[kJoinFdDoorbell].get(), kDoorbellBytes, Access::kReadWrite, "doorbell",
                 &joined.channel.doorbell).ok());
  REQUIRE(map_fd(joined.fds[kJoinFdClientRings].get(), kClientRingsBytes, Access::kReadWrite, "client rings",
                 &joined.channel.client_rings).ok());
  REQUIRE(map_fd(joined.fds[kJoinFdDaemonRings].get(), kDaemonRingsBytes, Access::kReadOnly, "daemon rings",
                 &joined.channel.daemon_rings).ok());
  return joined;
}

RawSegment raw_segment(Connection& raw, size_t bytes) {
  RawSegment segment;
  segment.memory = MappedMemfd::create("test", bytes);
  segment.memory.seal(kSizeSeals);
  control::Request announce;
  announce.mutable_segment()->set_kind(control::HOST_MEMFD);
  announce.mutable_segment()->set_bytes(bytes);
  const int fd = segment.memory.fd().get();
  segment.id = raw.call(announce, std::chrono::seconds(5), std::span<const int>(&fd, 1)).segment().segment_id();
  return segment;
}

std::pair<uint32_t, std::string> wait_for_failure(const DaemonRings* rings) {
  for (int i = 0; i < 500 && rings->failure_code.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const uint32_t code = rings->failure_code.load(std::memory_order_acquire);
  return {code, std::string(rings->failure_message, std::min<size_t>(rings->failure_length, kFailureMessageBytes))};
}

RawSocket::RawSocket(const std::string& path) {
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
}

RawSocket::~RawSocket() { ::close(fd_); }

void RawSocket::send(const std::string& bytes, const std::vector<int>& fds) {
  // Its own sendmsg(), without the library's limit on descriptors per message.
  iovec io{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  if (!fds.empty()) {
    message.msg_control = control.data();
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  REQUIRE(::sendmsg(fd_, &message, MSG_NOSIGNAL) == ssize_t(bytes.size()));
}

void RawSocket::finish_writing() { ::shutdown(fd_, SHUT_WR); }

std::string RawSocket::read_to_end() {
  timeval tv{10, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string all;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
    if (n <= 0) break;
    all.append(buffer, static_cast<size_t>(n));
  }
  return all;
}

control::Reply RawSocket::read_reply(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (unread_.size() >= kFrameHeaderBytes) {
      FrameDecoder decoder;
      decoder.feed(std::span<const std::byte>(reinterpret_cast<const std::byte*>(unread_.data()), unread_.size()));
      std::optional<std::string> payload;
      REQUIRE(decoder.next(&payload).ok());
      if (payload) {
        unread_.erase(0, kFrameHeaderBytes + payload->size());
        control::Reply reply;
        REQUIRE(reply.ParseFromString(*payload));
        return reply;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    REQUIRE(left.count() > 0);
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    std::vector<std::byte> buffer(1 << 16);
    Received got;
    const ssize_t n = receive_with_fds(fd_, buffer, MSG_DONTWAIT, &got);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    REQUIRE(n > 0);  // the daemon closed the connection without replying
    unread_.append(reinterpret_cast<const char*>(buffer.data()), static_cast<size_t>(n));
  }
}

bool RawSocket::readable() const {
  if (!unread_.empty()) return true;
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

std::string first_error(const std::string& bytes) {
  FrameDecoder decoder;
  decoder.feed(std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  std::optional<std::string> payload;
  REQUIRE(decoder.next(&payload).ok());
  REQUIRE(payload);
  control::Reply reply;
  REQUIRE(reply.ParseFromString(*payload));
  return reply.error().message();
}

std::string frame_of(const control::Request& request) { return encode_frame(request.SerializeAsString()); }

}  // namespace gradsync::test
