// A client whose connection ends in the middle of a registration: the daemon gives back
// everything the connection held (its place in the job, its segment, the waiting
// registration's count and bytes, its connection), and no request in flight touches the
// session or the handler after they are gone.
//
// Built with AddressSanitizer (tests/CMakeLists.txt), with session.cc and client_handler.cc
// compiled again, instrumented: each request is a coroutine suspended on a setup thread while
// the connection ends, and a use of its handler or session after they are freed is exactly what
// only a sanitizer sees; LeakSanitizer at exit sees what is never freed. The rest (the job
// registry, the host backend, the setup threads) is the daemon's own code.
//
// The test is the daemon's io thread; a second thread is the client, speaking the control
// protocol over a socketpair as the client library does.
#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <future>
#include <latch>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/backend/factory.h"
#include "daemon/control/session.h"
#include "daemon/job/reaper.h"
#include "daemon/job/registry.h"
#include "daemon/util/setup_threads.h"
#include "daemon/util/thread_pool.h"
#include "shared/fd_passing.h"
#include "shared/framing.h"
#include "shared/memfd.h"
#include "shared/version.h"

namespace gradsync {
namespace {

namespace asio = boost::asio;

// Over the session's inline-parse limit (64 KiB): the frame is parsed, and the set checked, on
// a setup thread.
constexpr int kTensors = 20'000;
constexpr size_t kTensorBytes = 16;

// The daemon's side: what a gradsyncd holds for control connections.
struct Daemon {
  asio::io_context io;
  Logger log{LogLevel::kWarning, "gradsyncd"};
  ThreadPool pool{1};
  Reaper reaper;
  SetupThreads setup{io, 1};
  std::unique_ptr<BackendFactory> backends = make_backend_factory(log, nullptr);
  std::shared_ptr<UserCounts> users;
  std::unique_ptr<JobRegistry> registry;

  Daemon() {
    LocalLimits limits;
    resolve_byte_limits(uint64_t{8} << 30, &limits);
    users = std::make_shared<UserCounts>(limits);
    RegistryOptions options;
    options.jobs.io = &io;
    options.jobs.pool = &pool;
    options.jobs.log = log;
    options.jobs.reaper = &reaper;
    options.jobs.setup = &setup;
    options.jobs.execution = ExecutionSettings{backends.get(), std::chrono::seconds(600)};
    options.limits = limits;
    options.users = users;
    registry = std::make_unique<JobRegistry>(std::move(options));
  }
  // A section that failed may leave sessions behind: they end before the registry they use.
  ~Daemon() {
    for (const auto& weak : sessions) {
      if (auto session = weak.lock()) session->stop(Status::aborted("the test ended"));
    }
    setup.join();
    run_until([&] {
      return std::all_of(sessions.begin(), sessions.end(), [](const auto& weak) { return weak.expired(); });
    });
  }
  std::vector<std::weak_ptr<Session>> sessions;

  // A session on one end of a socketpair; the other end is the client's.
  std::weak_ptr<Session> connect(UniqueFd* client) {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    client->reset(fds[1]);
    SessionOptions options;
    options.context = ControlContext{registry.get(), backends.get(), &setup, users};
    options.log = log;
    REQUIRE(users->take(UserCounts::What::kConnections, ::getuid(), 1, &options.connection).ok());
    Session::Socket socket(io);
    socket.assign(asio::local::stream_protocol(), fds[0]);
    auto session = std::make_shared<Session>(std::move(socket), PeerCredentials{::getpid(), ::getuid(), ::getgid()},
                                             std::move(options));
    session->start();
    sessions.push_back(session);
    return session;
  }

  // Runs the io thread until `done()`; false after 20 s.
  template <class Done>
  bool run_until(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      io.run_for(std::chrono::milliseconds(5));
      if (io.stopped()) io.restart();
    }
    return true;
  }

  // Everything a connection holds, given back.
  void check_nothing_held() {
    const uid_t uid = ::getuid();
    CHECK(users->held(UserCounts::What::kConnections, uid) == 0);
    CHECK(users->held(UserCounts::What::kSegments, uid) == 0);
    CHECK(users->held(UserCounts::What::kPendingRegistrations, uid) == 0);
    CHECK(users->held(UserCounts::What::kBytes, uid) == 0);
    CHECK(registry->size() == 0);
  }
};

// The client runs on a thread of its own, where Catch's assertions may not be used: a
// problem there throws, and reaches the test through its future.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("client: " + what);
}

// The client's side: blocking calls, one reply each.
struct Client {
  UniqueFd socket;
  FrameDecoder decoder;
  uint64_t next_id = 1;

  void send(control::Request request, std::vector<int> fds = {}) {
    request.set_id(next_id++);
    request.set_fd_count(static_cast<uint32_t>(fds.size()));
    const std::string frame = encode_frame(request.SerializeAsString());
    std::span<const std::byte> bytes = std::as_bytes(std::span<const char>(frame.data(), frame.size()));
    const ssize_t first = send_with_fds(socket.get(), bytes, fds, 0);
    expect(first > 0, "sendmsg failed");
    bytes = bytes.subspan(static_cast<size_t>(first));
    while (!bytes.empty()) {
      const ssize_t n = ::send(socket.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      expect(n > 0, "send failed");
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
  }

  control::Reply reply() {
    std::optional<std::string> payload;
    std::vector<std::byte> buffer(64 << 10);
    for (;;) {
      expect(decoder.next(&payload).ok(), "a reply frame does not decode");
      if (payload) break;
      Received got;
      const ssize_t n = receive_with_fds(socket.get(), buffer, 0, &got);
      expect(n > 0, "the daemon closed the connection");
      decoder.feed(std::span<const std::byte>(buffer.data(), static_cast<size_t>(n)));
    }
    control::Reply reply;
    expect(reply.ParseFromString(*payload), "a reply does not parse");
    expect(!reply.has_error(), "refused: " + reply.ShortDebugString());
    return reply;
  }

  // Hello, a join as rank 0 of a job of two ranks on this node (rank 1 never comes, so a
  // registration waits at its barrier), and one host segment.
  void join_with_segment(const std::string& job) {
    control::Request hello;
    hello.mutable_hello()->set_protocol_version(kProtocolVersion);
    send(hello);
    reply();
    control::Request join;
    join.mutable_join()->set_job_id(job);
    join.mutable_join()->set_rank(0);
    join.mutable_join()->set_world_size(2);
    join.mutable_join()->set_local_rank(0);
    join.mutable_join()->set_local_world_size(2);
    send(join);
    reply();
    MappedMemfd memory = MappedMemfd::create("asan-test", kTensors * kTensorBytes);
    memory.seal(kSizeSeals);
    control::Request segment;
    segment.mutable_segment()->set_kind(control::HOST_MEMFD);
    segment.mutable_segment()->set_bytes(memory.size());
    send(segment, {memory.fd().get()});
    expect(reply().segment().segment_id() == 1, "the segment is not segment 1");
  }

  // A registration of `tensors` float32 tensors in segment 1; kTensors make a frame over 64 KiB.
  void send_registration(int tensors = kTensors) {
    control::Request request;
    auto* body = request.mutable_register_();
    body->set_set_id(0);
    for (int t = 0; t < tensors; ++t) {
      auto* tensor = body->add_tensors();
      tensor->set_dtype(control::FLOAT32);
      tensor->set_numel(kTensorBytes / 4);
      tensor->set_segment_id(1);
      tensor->set_offset(static_cast<uint64_t>(t) * kTensorBytes);
    }
    send(std::move(request));
  }
};

// Bytes the client sent that the daemon has not read yet.
int unread(const Client& client) {
  int n = 0;
  REQUIRE(::ioctl(client.socket.get(), SIOCOUTQ, &n) == 0);
  return n;
}

}  // namespace

TEST_CASE("asan: a connection that ends mid-registration gives back everything it held",
          "[registration_disconnect]") {
  Daemon daemon;
  // The daemon reads no further while it serves a request, so it sees this end of stream once
  // the registration (parsed and checked off the io thread) is with the job.
  SECTION("the client disconnects right after sending its registration") {
    Client client;
    std::weak_ptr<Session> session = daemon.connect(&client.socket);
    auto setup = std::async(std::launch::async, [&] {
      client.join_with_segment("asan-gone");
      client.send_registration();
      client.socket.reset();  // gone, without waiting for an answer
    });
    REQUIRE(daemon.run_until([&] { return setup.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
    setup.get();
    REQUIRE(daemon.run_until([&] { return session.expired() && daemon.registry->size() == 0; }));
    daemon.check_nothing_held();
  }
  SECTION("the client disconnects while its registration waits for the job's other rank") {
    Client client;
    std::weak_ptr<Session> session = daemon.connect(&client.socket);
    auto setup = std::async(std::launch::async, [&] {
      client.join_with_segment("asan-waiting");
      client.send_registration();
    });
    REQUIRE(daemon.run_until([&] { return setup.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
    setup.get();
    // The registration holds its count until the barrier (which never completes) answers it.
    REQUIRE(daemon.run_until(
        [&] { return daemon.users->held(UserCounts::What::kPendingRegistrations, ::getuid()) == 1; }));
    client.socket.reset();
    REQUIRE(daemon.run_until([&] { return session.expired() && daemon.registry->size() == 0; }));
    daemon.check_nothing_held();
  }
  // The daemon's shutdown ends the connection while the registration waits for the one setup
  // thread, which the test holds (as a driver call that never returns would): its frame's
  // parsing (over 64 KiB), or, for a smaller frame parsed on the io thread, the handler's check
  // of the set. The request is abandoned: the session ends, and gives everything back, while
  // the setup thread is still held; the work's late result is dropped.
  for (const int tensors : {kTensors, 2'000}) {
    DYNAMIC_SECTION("the daemon ends the connection (shutdown) while a registration of " << tensors
                    << " tensors waits for a setup thread") {
      Client client;
      std::weak_ptr<Session> session = daemon.connect(&client.socket);
      auto setup = std::async(std::launch::async, [&] { client.join_with_segment("asan-stopped"); });
      REQUIRE(daemon.run_until([&] { return setup.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
      setup.get();
      // Released however the section ends, so that a failure does not leave it waiting; shared
      // with the work, which may still be returning from its wait when the section ends.
      auto release = std::make_shared<std::latch>(1);
      struct Release {
        std::shared_ptr<std::latch> latch;
        bool done = false;
        void now() {
          if (!std::exchange(done, true)) latch->count_down();
        }
        ~Release() { now(); }
      } releaser{release};
      daemon.setup.run(
          [release] {
            release->wait();
            return Status();
          },
          [](Status) {});
      auto sent = std::async(std::launch::async, [&] { client.send_registration(tensors); });
      REQUIRE(daemon.run_until([&] {
        return sent.wait_for(std::chrono::seconds(0)) == std::future_status::ready && unread(client) == 0;
      }));
      sent.get();
      daemon.io.run_for(std::chrono::milliseconds(20));
      REQUIRE_FALSE(session.expired());
      session.lock()->stop(Status::aborted("gradsyncd is shutting down"));
      REQUIRE(daemon.run_until([&] { return session.expired() && daemon.registry->size() == 0; }));
      daemon.check_nothing_held();
      releaser.now();
      daemon.setup.join();  // the held work, and the request's own work after it, run and are dropped
      daemon.io.run_for(std::chrono::milliseconds(50));
      daemon.check_nothing_held();
    }
  }
}

}  // namespace gradsync
