// gradsyncd as a service runs under a dedicated user (sysusers.d makes it), configured by its
// TOML file: trainers of two other users, listed there with allow-uid, connect at the same time,
// hand it their memory by descriptor (no file of theirs is opened by name), and both jobs verify;
// gradsyncctl shows root every job and each user only their own.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "client/tools/process.h"
#include "tests/integration/harness.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;

// A trainer of a job of two ranks that trusts the daemon's user, steps with verified sums, and
// waits for the test to have looked before it leaves.
int trainer(const std::string& socket, uid_t daemon_uid, const std::string& job, int rank, const Latch& stepped,
            const Latch& looked) {
  ConnectOptions connect{socket};
  connect.daemon_uid = daemon_uid;
  auto client = Client::connect(connect);
  client->join(JoinOptions{job, rank, 2, rank, 2});
  const TensorSet set =
      client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 4096, "dp"}}), {});
  for (int step = 0; step < 5; ++step) {
    const auto values = set.tensor(0).as<float>();
    for (auto& v : values) v = static_cast<float>(rank + 1 + step);
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(10s)) return fail("step timed out");
    for (float v : values) {
      if (v != static_cast<float>(3 + 2 * step)) return fail("wrong sum in job " + job);
    }
  }
  stepped.open();
  return looked.wait(60s) ? kOk : fail("the test never looked");
}

}  // namespace

TEST_CASE("service user: gradsyncd as a dedicated user serves two other users' trainers at once, by descriptor",
          "[integration][service]") {
  const TestUser service = system_user("gradsync-svc-test");
  const TestUser other = system_user("gradsync-test");
  char pattern[] = "/tmp/gradsync-svc-XXXXXX";
  REQUIRE(::mkdtemp(pattern));
  const std::string dir = pattern;
  // As RuntimeDirectory=gradsync would: a folder the service user owns, that others may enter.
  REQUIRE(::chown(dir.c_str(), service.uid, service.gid) == 0);
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  const std::string socket = dir + "/gradsync.sock";
  const std::string config = dir + "/gradsyncd.toml";
  std::ofstream(config) << "allow-uid = [0, " << other.uid << "]\ntimeout-ms = 20000\nlog-level = \"debug\"\n";
  ChildProcess daemon({"/usr/bin/setpriv", "--reuid", std::to_string(service.uid), "--regid", std::to_string(service.gid),
                       "--clear-groups", GRADSYNCD_BINARY, "--config", config, "--socket", socket, "--peer-listen",
                       "127.0.0.1:0"},
                      dir + "/daemon.log");
  for (int i = 0; i < 200 && !std::filesystem::exists(dir + "/admin.sock"); ++i) std::this_thread::sleep_for(25ms);
  REQUIRE(std::filesystem::exists(dir + "/admin.sock"));
  struct stat info {};
  REQUIRE(::stat(socket.c_str(), &info) == 0);
  CHECK(info.st_uid == service.uid);
  CHECK((info.st_mode & 0777) == 0666);  // others are allowed: the socket opens, each uid is checked

  const std::string root_job = unique_job("svc-root"), other_job = unique_job("svc-other");
  Latch stepped[4], looked[4];
  ClientGroup trainers(4, [&](int i) {
    if (i >= 2 && !become(other)) return fail(std::string("cannot become the other user: ") + std::strerror(errno));
    return trainer(socket, service.uid, i < 2 ? root_job : other_job, i % 2, stepped[i], looked[i]);
  });
  for (const Latch& l : stepped) REQUIRE(l.wait(60s));
  const auto ctl = [&](const std::string& args, const std::string& user = {}) {
    std::string command = std::string(GRADSYNCCTL_BINARY) + " --admin unix:" + dir + "/admin.sock " + args;
    if (!user.empty()) command = "/usr/bin/setpriv --reuid " + user + " --regid " + user + " --clear-groups " + command;
    return run_command(command);
  };
  // Both users' trainers are connected at once; root sees both jobs, each user only theirs.
  const CommandRun clients = ctl("clients");
  INFO(clients.output);
  CHECK_THAT(clients.output, Catch::Contains(root_job) && Catch::Contains(other_job));
  const CommandRun mine = ctl("jobs", std::to_string(other.uid));
  INFO(mine.output);
  CHECK(mine.code == 0);
  CHECK_THAT(mine.output, Catch::Contains(other_job) && !Catch::Contains(root_job));
  const CommandRun status = ctl("status");
  CHECK_THAT(status.output, Catch::Contains("uid " + std::to_string(service.uid)) &&
                                Catch::Contains("jobs: 2, clients: 4"));
  for (const Latch& l : looked) l.open();
  for (int s : trainers.wait_all(60s)) CHECK(exit_code(s) == kOk);
  daemon.signal(SIGTERM);
  CHECK(exit_code(daemon.wait_for(10s)) == 0);
  std::ifstream log_file(dir + "/daemon.log");
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  INFO(log);
  CHECK_THAT(log, Catch::Contains("job=" + root_job + " uid=0") &&
                      Catch::Contains("job=" + other_job + " uid=" + std::to_string(other.uid)));
  std::filesystem::remove_all(dir);
}

}  // namespace gradsync::test
