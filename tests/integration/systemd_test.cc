// gradsyncd under systemd's notification protocol, observed on a test NOTIFY_SOCKET: READY=1
// once it serves, WATCHDOG=1 every half WATCHDOG_USEC while its io thread runs, and no more
// once that thread hangs (a test hook blocks it), which is what makes systemd restart it;
// STOPPING=1 at SIGTERM.
#include <catch2/catch.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A datagram socket standing in for systemd's notification socket.
class NotifySocket {
 public:
  NotifySocket() {
    char dir[] = "/tmp/gradsync-notify-XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    dir_ = dir;
    path_ = dir_ + "/notify";
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  }
  ~NotifySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

  // Every message that arrives within `window`, with its arrival time.
  std::vector<std::pair<Clock::time_point, std::string>> collect(std::chrono::milliseconds window) {
    std::vector<std::pair<Clock::time_point, std::string>> got;
    const auto end = Clock::now() + window;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) return got;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n > 0) got.emplace_back(Clock::now(), std::string(buffer, static_cast<size_t>(n)));
    }
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
};

size_t count(const std::vector<std::pair<Clock::time_point, std::string>>& messages, const std::string& what) {
  size_t n = 0;
  for (const auto& [at, text] : messages) n += text.find(what) != std::string::npos;
  return n;
}

// Starts a daemon with the notification variables set (for it only).
std::unique_ptr<TestDaemon> notifying_daemon(const NotifySocket& socket, const char* hang_after_ms = nullptr) {
  ::setenv("NOTIFY_SOCKET", socket.path().c_str(), 1);
  ::setenv("WATCHDOG_USEC", "200000", 1);
  if (hang_after_ms) ::setenv("GRADSYNCD_TEST_HANG_IO_AFTER_MS", hang_after_ms, 1);
  auto daemon = std::make_unique<TestDaemon>();
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("GRADSYNCD_TEST_HANG_IO_AFTER_MS");
  return daemon;
}

}  // namespace

TEST_CASE("systemd: READY=1 once serving, watchdog pings, STOPPING=1 at SIGTERM", "[integration][systemd]") {
  NotifySocket notify;
  auto daemon = notifying_daemon(notify);
  const auto first = notify.collect(1500ms);
  INFO(first.size() << " messages");
  REQUIRE(!first.empty());
  CHECK(first.front().second.find("READY=1") != std::string::npos);
  CHECK(first.front().second.find("STATUS=serving on " + daemon->socket()) != std::string::npos);
  CHECK(count(first, "WATCHDOG=1") >= 8);  // every 100 ms (half of WATCHDOG_USEC)
  daemon->process().signal(SIGTERM);
  const auto last = notify.collect(1000ms);
  CHECK(count(last, "STOPPING=1") == 1);
  // The drain may outlast TimeoutStopSec: it asks for its time (2 s drain + 10 s).
  CHECK(count(last, "EXTEND_TIMEOUT_USEC=12000000") == 1);
}

TEST_CASE("systemd: the watchdog pings stop when the io thread hangs", "[integration][systemd]") {
  NotifySocket notify;
  auto daemon = notifying_daemon(notify, "700");
  const auto start = Clock::now();
  const auto messages = notify.collect(2000ms);
  size_t before = 0, after = 0;
  // The hook blocks the io thread 700 ms after start; leave it 300 ms either side.
  for (const auto& [at, text] : messages) {
    if (text.find("WATCHDOG=1") == std::string::npos) continue;
    if (at - start < 600ms) ++before;
    if (at - start > 1000ms) ++after;
  }
  CHECK(before >= 3);  // pinging while the io thread runs
  CHECK(after == 0);   // nothing once it hangs: systemd would now restart the daemon
  CHECK_THAT(daemon->log(), Catch::Contains("blocking the io thread for good (a test hook)"));
  daemon->process().signal(SIGKILL);
}

// A sticky CUDA error leaves the daemon's context on that GPU broken for good: the daemon fails
// that GPU's jobs (tested with the fake device), drains the rest and exits 75, which
// Restart=on-failure restarts. The test hook reports GPU 0 lost on a machine without one. It
// must exit well before its last-resort deadline (the drain bound + 10 s): the stop used to
// leave the stop signals' wait pending, so io_.run() never returned.
TEST_CASE("systemd: a daemon whose GPU is lost drains and exits with status 75, to be restarted",
          "[integration][systemd][gpu-lost]") {
  ::setenv("GRADSYNCD_TEST_GPU_LOST_AFTER_MS", "200", 1);
  TestDaemon daemon({"--drain-timeout-ms", "500"});
  ::unsetenv("GRADSYNCD_TEST_GPU_LOST_AFTER_MS");
  const int status = daemon.process().wait_for(5s);
  INFO(daemon.log());
  REQUIRE(status != -1);
  CHECK(describe_wait_status(status) == "exited 75");
  CHECK_THAT(daemon.log(), Catch::Contains("GPU 0: GPU 0 is unusable: a test said so. gradsyncd drains and exits "
                                           "with status 75 so that systemd restarts it (Restart=on-failure)"));
}

}  // namespace gradsync::test
