// A client that floods the control socket with requests and never reads the replies is
// disconnected once its replies pass SessionOptions::max_outbox_bytes, and the daemon carries on.
//
// Built with AddressSanitizer (tests/CMakeLists.txt), because the overflow here is made to happen
// while the session's writer still has a write of the outbox's front in flight: a session that
// dropped its queue at that point (as send() once did) frees the frame under that write, the
// writer then pops it again, and only a sanitizer reliably turns that into a failure. CTest
// also requires the daemon's log line for the overflow (run_and_match.cmake).
//
// The test is both the daemon's io thread and the client, so it can order the two exactly: it
// steps the io_context one handler at a time until the writer is busy, and only then floods.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/control/session.h"
#include "shared/framing.h"
#include "shared/version.h"

namespace gradsync {
namespace {

namespace asio = boost::asio;

constexpr size_t kMaxOutboxBytes = 64u << 10;
// Request ids count from here. Replies echo them, which makes every reply frame too long for
// std::string's inline buffer: a frame freed twice is then a heap double free ASan names.
constexpr uint64_t kFirstId = 1'000'000'000;
// Replies to these fit the outbox and the kernel's socket buffer with room to spare, so the
// writer sends them one write at a time, each completing at once.
constexpr size_t kFirstBatch = 32;

// A Session on one end of a socketpair; the test holds the other end, non-blocking, as the
// client. The session keeps itself alive through its coroutines, so the test only watches it.
struct Connection {
  std::weak_ptr<Session> session;
  UniqueFd client;
  uint64_t next_id = kFirstId;
  FrameDecoder decoder;
  std::vector<control::Reply> replies;  // every complete reply read so far
  int end = EAGAIN;                     // 0 at end of stream, else the errno that ended it
};

std::unique_ptr<Connection> connect(asio::io_context& io) {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  UniqueFd daemon_end(fds[0]);
  auto connection = std::make_unique<Connection>();
  connection->client.reset(fds[1]);
  REQUIRE(::fcntl(fds[1], F_SETFL, O_NONBLOCK) == 0);
  Session::Socket socket(io);
  socket.assign(asio::local::stream_protocol(), daemon_end.get());
  daemon_end.release();
  SessionOptions options;
  options.log = Logger(LogLevel::kInfo, "gradsyncd");
  options.max_outbox_bytes = kMaxOutboxBytes;
  auto session = std::make_shared<Session>(std::move(socket), PeerCredentials{::getpid(), ::getuid(), ::getgid()},
                                           std::move(options));
  session->start();
  connection->session = session;
  return connection;
}

std::string hello_frame(uint64_t id) {
  control::Request hello;
  hello.set_id(id);
  hello.mutable_hello()->set_protocol_version(kProtocolVersion);
  return encode_frame(hello.SerializeAsString());
}

// Sends `count` Hello requests, numbered on from the last, in one write without blocking (the
// test is also the io thread); false if the kernel's socket buffer took less.
bool send_hellos(Connection& c, size_t count) {
  std::string frames;
  for (size_t i = 0; i < count; ++i) frames += hello_frame(c.next_id++);
  return ::send(c.client.get(), frames.data(), frames.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frames.size());
}

// Bytes the daemon has written that the client has not read.
int bytes_waiting(const Connection& c) {
  int n = 0;
  REQUIRE(::ioctl(c.client.get(), FIONREAD, &n) == 0);
  return n;
}

// Reads everything the daemon has written so far, decoding complete replies, and notes how the
// stream ended, if it has.
void read_available(Connection& c) {
  char buffer[16 << 10];
  for (;;) {
    const ssize_t n = ::read(c.client.get(), buffer, sizeof(buffer));
    if (n > 0) {
      c.decoder.feed(std::as_bytes(std::span<const char>(buffer, static_cast<size_t>(n))));
      continue;
    }
    c.end = n == 0 ? 0 : errno;
    if (c.end == EINTR) continue;
    break;
  }
  std::optional<std::string> payload;
  while (c.decoder.next(&payload).ok() && payload) {
    REQUIRE(c.replies.emplace_back().ParseFromString(*payload));
  }
}

// Runs the io_context one handler at a time until `done()`; false if that takes over 10 s.
template <typename Done>
bool step_until(asio::io_context& io, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    io.run_one_for(std::chrono::milliseconds(10));
    if (io.stopped()) io.restart();
  }
  return true;
}

// Makes the session's outbox overflow while a write of its front is in flight.
void overflow_while_writing(asio::io_context& io, Connection& flooder) {
  REQUIRE(send_hellos(flooder, kFirstBatch));
  // Stop right after the handler that wrote the first reply: that write has completed in the
  // kernel, its completion is queued on the io_context, and the other replies wait behind it.
  REQUIRE(step_until(io, [&] { return bytes_waiting(flooder) > 0; }));
  // A Hello reply is longer than the request (it names the daemon's version), so these requests,
  // read in one go, queue more reply bytes than the outbox may hold.
  REQUIRE(send_hellos(flooder, kMaxOutboxBytes / hello_frame(kFirstId).size()));
  REQUIRE(step_until(io, [&] { return flooder.session.expired(); }));
}

}  // namespace

TEST_CASE("session: a client that floods requests and reads nothing is disconnected, with a reply write in flight",
          "[session][asan]") {
  asio::io_context io;
  auto flooder = connect(io);
  overflow_while_writing(io, *flooder);

  // The client reads the replies written before the overflow, in order and with none dropped
  // from the middle, then the end of the connection (ECONNRESET when the daemon closed with
  // requests still unread).
  read_available(*flooder);
  CHECK((flooder->end == 0 || flooder->end == ECONNRESET));
  REQUIRE(!flooder->replies.empty());
  CHECK(flooder->replies.size() < flooder->next_id - kFirstId);
  for (size_t i = 0; i < flooder->replies.size(); ++i) {
    CHECK(flooder->replies[i].id() == kFirstId + i);
    CHECK(flooder->replies[i].has_hello());
  }
}

TEST_CASE("session: the io thread serves other clients after one overflowed its outbox", "[session][asan]") {
  asio::io_context io;
  auto bystander = connect(io);
  auto flooder = connect(io);
  overflow_while_writing(io, *flooder);

  REQUIRE(send_hellos(*bystander, 1));
  REQUIRE(step_until(io, [&] {
    read_available(*bystander);
    return !bystander->replies.empty();
  }));
  CHECK(bystander->replies.front().id() == kFirstId);
  CHECK(bystander->replies.front().hello().protocol_version() == kProtocolVersion);

  // A plain disconnect ends that session too, and nothing is left running.
  bystander->client.reset();
  REQUIRE(step_until(io, [&] { return bystander->session.expired(); }));
}

}  // namespace gradsync
