// The review's connection floods at the review's size: 20,000 connections on the peer port,
// and 20,000 on the admin socket from one allowed user, while a victim job steps 4 KiB
// allreduces and a new trainer joins. The daemon keeps what it holds of each listener bounded
// (tcp_listener.h, admin_server.cc), so the victim has no errors, its p99 stays within 3x of
// its idle p99 (or its idle p99 plus 250 us, whichever is larger), the newcomer joins, and
// afterwards the listener answers within a second.
//
// Why the absolute slack: on 2 shared cores the flooder (even at nice 19) and the daemon's
// accept loop take a core now and then, and a victim woken while both cores are busy waits one
// wake-up preemption, about 100 us here, however well the daemon bounds the flood. An idle p99
// of 37 us made that 3.8x in one CI run (140 us). Starvation, the failure this guards against,
// shows as stalls of milliseconds or errors, far past either bound.
//
// The flooder runs at nice 19: on a real cluster the flood comes from other machines, and
// what is under test is what the daemon lets it hold, not how the two cores here share out.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <span>
#include <vector>

#include "client/tools/process.h"
#include "daemon/peer/peer_client.h"
#include "tests/integration/harness.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;

constexpr int kFlood = 20'000;
constexpr int kIdleSteps = 2000;  // enough for a p99 that is not the 5th sample of 500
constexpr double kSchedulerSlackUs = 250;
constexpr int kMinFloodSteps = 200;

double p99(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1, samples.size() * 99 / 100)];
}

// What the victim saw, written by its rank 0.
struct VictimReport {
  double idle_p99_us = 0;
  double flood_p99_us = 0;
  int flood_steps = 0;
  int errors = -1;
};

// Two ranks stepping 4 KiB allreduces: kIdleSteps before the flood (then `idle` opens), and
// on until `flood_over` opens (kMinFloodSteps at least). Every step checks the sum.
class Victim {
 public:
  Victim(const TestDaemon& daemon, std::string report)
      : report_(std::move(report)), job_(unique_job("flood-victim")), group_(2, [this, socket = daemon.socket()](int rank) { return run(socket, rank); }) {}

  const Latch& idle() const { return idle_; }
  void end_flood() const { flood_over_.open(); }
  VictimReport wait() {
    VictimReport r;
    for (int status : group_.wait_all(120s)) CHECK(exit_code(status) == kOk);
    std::ifstream(report_) >> r.idle_p99_us >> r.flood_p99_us >> r.flood_steps >> r.errors;
    return r;
  }

 private:
  int run(const std::string& socket, int rank) {
    auto client = join(socket, job_, rank, 2);
    const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 1024, "dp"})};
    const TensorSet set = client->register_tensors(tensors, {});
    int errors = 0;
    // One step; rank 0 adds 1000 to element 0 of its last, so both ranks stop together.
    bool last = false;
    const auto step = [&](bool stop) -> double {
      const std::span<float> values = tensors[0].as<float>();
      std::fill(values.begin(), values.end(), 1.0f);
      if (stop) values[0] += 1000.0f;
      const auto start = std::chrono::steady_clock::now();
      const bool done = client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(10s);
      const auto took = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      if (!done || (values[0] != 2.0f && values[0] != 1002.0f) || values[1023] != 2.0f) {
        ++errors;
        last = true;
      }
      last = last || values[0] == 1002.0f;
      return took;
    };
    std::vector<double> idle, flooded;
    for (int i = 0; i < kIdleSteps; ++i) idle.push_back(step(false));
    if (rank == 0) idle_.open();
    // Both ranks step until the flood is over (kMinFloodSteps at least), as rank 0 says.
    for (int i = 0; !last; ++i) {
      flooded.push_back(step(rank == 0 && i >= kMinFloodSteps && flood_over_.wait(0ms)));
    }
    if (rank == 0) {
      std::ofstream(report_) << p99(idle) << " " << p99(flooded) << " " << flooded.size() << " " << errors << "\n";
    }
    return kOk;
  }

  std::string report_;
  std::string job_;
  Latch idle_, flood_over_;
  ClientGroup group_;
};

// Makes kFlood connections with `connect_one` (a connected descriptor, or -1), as fast as it
// can, keeping every one the daemon leaves open (one it closed is closed here too, as an
// attacker would: this process may hold fewer than kFlood descriptors) until `release`, and
// prints how many connected and how many the daemon closed.
int flood(const std::function<int()>& connect_one, const Latch& flooded, const Latch& release, const char* what) {
  ::setpriority(PRIO_PROCESS, 0, 19);
  std::vector<int> held;
  int failed = 0, closed = 0;
  const auto sweep = [&] {
    std::vector<int> open;
    for (int fd : held) {
      if (closed_by_other_end(fd)) {
        ++closed;
        ::close(fd);
      } else {
        open.push_back(fd);
      }
    }
    held.swap(open);
  };
  for (int i = 0; i < kFlood; ++i) {
    const int fd = connect_one();
    if (fd >= 0) {
      held.push_back(fd);
    } else {
      ++failed;
    }
    if (held.size() >= 4096) sweep();
  }
  std::this_thread::sleep_for(500ms);  // the daemon has seen them all
  sweep();
  std::printf("%s flood: %d connections made, %d refused at connect; the daemon closed %d, %zu still open\n", what,
              kFlood - failed, failed, closed, held.size());
  flooded.open();
  if (!release.wait(120s)) return fail("never released");
  for (int fd : held) ::close(fd);
  // Nearly all were closed by the daemon.
  return closed >= kFlood - failed - 300 ? kOk : fail(std::to_string(closed) + " closed by the daemon");
}

// Room for the flood's descriptors: as many as the hard limit allows (4096 are held at most).
bool room_for_flood() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return false;
  files.rlim_cur = files.rlim_max;
  return ::setrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur >= 4096 + 256;
}

// A trainer of a new job joins and steps while the flood goes on.
void newcomer_joins(const TestDaemon& daemon) {
  const auto start = std::chrono::steady_clock::now();
  check_still_serving(daemon);
  std::printf("  a new trainer joined and stepped in %.3f s during the flood\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void report(const VictimReport& victim) {
  std::printf("  victim, 4 KiB allreduce: p99 idle %.1f us, during the flood %.1f us (%.2fx, %d steps); %d errors\n",
              victim.idle_p99_us, victim.flood_p99_us, victim.flood_p99_us / victim.idle_p99_us, victim.flood_steps,
              victim.errors);
  CHECK(victim.errors == 0);
  CHECK(victim.flood_steps >= kMinFloodSteps);
  const double bound = std::max(3 * victim.idle_p99_us, victim.idle_p99_us + kSchedulerSlackUs);
  std::printf("  bound on the flood p99: %.1f us\n", bound);
  CHECK(victim.flood_p99_us <= bound);
}

// Once the flooder has made its connections: lets it go, then ends the victim's flood phase
// and checks what the victim saw.
void end_flood(const Latch& flooded, const Latch& release, ClientGroup& flooder, Victim& victim) {
  REQUIRE(flooded.wait(120s));
  release.open();
  CHECK(exit_code(flooder.wait(0, 60s)) == kOk);
  victim.end_flood();
  report(victim.wait());
}

}  // namespace

TEST_CASE("flood: 20,000 connections on the peer port, a stepping job keeps its p99, a new trainer joins, the peer "
          "service answers after",
          "[integration][flood][serial]") {
  const int port = free_loopback_port();
  ClusterToken token;
  TestDaemon daemon({"--peer-listen", "127.0.0.1:" + std::to_string(port), "--peer-token-file", token.path()});
  auto member = std::make_shared<PeerAuth>();
  std::getline(std::ifstream(token.path()), member->token);
  member->node = "a-node:1";
  const std::string report_path = "/tmp/gradsync-flood-" + std::to_string(::getpid()) + ".peer";
  Victim victim(daemon, report_path);
  REQUIRE(victim.idle().wait(60s));
  Latch flooded, release;
  ClientGroup flooder(1, [&](int) {
    if (!room_for_flood()) {
      flooded.open();
      return fail("cannot raise the descriptor limit");
    }
    return flood(
        [port] {
          const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in address{};
          address.sin_family = AF_INET;
          address.sin_port = htons(static_cast<uint16_t>(port));
          address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return fd;
          ::close(fd);
          return -1;
        },
        flooded, release, "peer port");
  });
  std::this_thread::sleep_for(300ms);  // the flood is under way
  newcomer_joins(daemon);
  // Other daemons' calls during the flood, each on a new connection that stays open: 80 of
  // them, past the 64 a host may hold unproven (proven ones count only toward the total). The
  // flood comes from this host too (loopback), so it competes for the same 64 unproven slots:
  // a newcomer is closed only if the flood draws it before its first call arrives.
  std::vector<std::unique_ptr<PeerClient>> peers;
  int peer_answered = 0, late_answered = 0;
  for (int i = 0; i < 80; ++i) {
    peers.push_back(std::make_unique<PeerClient>("127.0.0.1:" + std::to_string(port), member));
    int64_t count = 0;
    const bool ok = peers.back()->add("0.flood-victim", "incarnations", 1, 2s, &count).ok();
    peer_answered += ok;
    late_answered += ok && i >= 64;
    std::this_thread::sleep_for(20ms);
  }
  std::printf("  during the flood, %d of 80 peer calls on new connections kept open were answered (%d of the 16 "
              "past 64)\n",
              peer_answered, late_answered);
  CHECK(peer_answered >= 72);
  CHECK(late_answered >= 14);
  end_flood(flooded, release, flooder, victim);
  // Afterwards the peer service answers a newcomer at once.
  const auto ended = std::chrono::steady_clock::now();
  PeerClient fresh("127.0.0.1:" + std::to_string(port), member);
  const Status answered = fresh.ping(1s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ended).count();
  std::printf("  after the flood a Ping answered in %.3f s\n", seconds);
  CHECK(answered.ok());
  CHECK(seconds < 1.0);
  const std::string log = daemon.log();
  CHECK(log.find("Too many open files") == std::string::npos);
  CHECK_THAT(log, Catch::Contains("peer service: closed"));
  CHECK(daemon.running());
  std::remove(report_path.c_str());
}

TEST_CASE("flood: 20,000 admin connections from one allowed user, a stepping job keeps its p99, a new trainer "
          "joins, admin calls go on",
          "[integration][flood][admin][serial]") {
  const TestUser attacker = test_user();
  const std::string user = std::to_string(attacker.uid);
  TestDaemon daemon({"--allow-uid", "0", "--allow-uid", user});
  open_socket_folder(daemon);
  const std::string path = admin_socket(daemon);
  const std::string report_path = "/tmp/gradsync-flood-" + std::to_string(::getpid()) + ".admin";
  Victim victim(daemon, report_path);
  REQUIRE(victim.idle().wait(60s));
  Latch flooded, release;
  ClientGroup flooder(1, [&](int) {
    if (!room_for_flood() || !become(attacker)) {
      flooded.open();
      return fail("cannot raise the descriptor limit or become the test user");
    }
    return flood(
        [&path] {
          const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_un address{};
          address.sun_family = AF_UNIX;
          std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
          if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return fd;
          ::close(fd);
          return -1;
        },
        flooded, release, "admin socket");
  });
  std::this_thread::sleep_for(300ms);
  newcomer_joins(daemon);
  const CommandRun during = gradsyncctl(daemon, "status");  // root's admin calls go on
  INFO(during.output);
  CHECK(during.code == 0);
  end_flood(flooded, release, flooder, victim);
  const auto ended = std::chrono::steady_clock::now();
  bool answered = false;
  while (!answered && std::chrono::steady_clock::now() - ended < 5s) answered = gradsyncctl(daemon, "status", user).code == 0;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ended).count();
  std::printf("  after the flood the flooder's own admin call answered in %.3f s\n", seconds);
  CHECK(answered);
  CHECK(seconds < 1.0);
  const std::string log = daemon.log();
  CHECK(log.find("Too many open files") == std::string::npos);
  // Logged once a second at most, not once per connection.
  size_t lines = 0;
  for (size_t at = log.find("admin connections, the limit per user"); at != std::string::npos;
       at = log.find("admin connections, the limit per user", at + 1)) {
    ++lines;
  }
  INFO(lines << " lines about the cap");
  CHECK(lines >= 1);
  CHECK(lines <= 30);
  CHECK(daemon.running());
  std::remove(report_path.c_str());
}

}  // namespace gradsync::test
