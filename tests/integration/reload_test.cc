// SIGHUP: gradsyncd reads its configuration file again. A valid change takes effect (the job
// bounds, the log level, the allowed users) and is logged; one that needs a restart says so; an
// invalid file is rejected with a log line naming the problem, and the old configuration stays.
#include <catch2/catch.hpp>
#include <regex>
#include <sys/stat.h>
#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;

std::string status_of(const TestDaemon& daemon) { return gradsyncctl(daemon, "status").output; }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// Waits until the daemon's log has `text` `count` times.
bool logged(const TestDaemon& daemon, const std::string& text, size_t count = 1) {
  for (int i = 0; i < 200; ++i) {
    const std::string log = daemon.log();
    size_t found = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++found;
    if (found >= count) return true;
    std::this_thread::sleep_for(25ms);
  }
  return false;
}

}  // namespace

TEST_CASE("reload: SIGHUP applies a valid configuration file and rejects an invalid one", "[integration][reload]") {
  char dir[] = "/tmp/gradsync-reload-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string file = std::string(dir) + "/gradsyncd.toml";
  // (The test daemon's command line sets --log-level and --peer-listen, which win over the file.)
  write_file(file, "timeout-ms = 30000\n");
  TestDaemon daemon({"--config", file});
  CHECK(std::regex_search(status_of(daemon), std::regex(R"(timeout-ms\s+30000\n)")));
  const auto mode = [](const std::string& path) {
    struct stat info {};
    REQUIRE(::stat(path.c_str(), &info) == 0);
    return info.st_mode & 0777;
  };
  CHECK(mode(daemon.socket()) == 0600);  // its own user and root only
  CHECK(mode(admin_socket(daemon)) == 0600);

  write_file(file, "timeout-ms = 1234\nallow-uid = [4242, 0]\nreduce_threads = 1\ngloo-slice-bytes = 1048576\n");
  daemon.process().signal(SIGHUP);
  REQUIRE(logged(daemon, "SIGHUP: configuration reloaded; applied: timeout-ms, allow-uid"));
  CHECK(logged(daemon, "SIGHUP: reduce-threads changed in the configuration; it takes effect when gradsyncd restarts"));
  // Every node of a job must slice alike, so a running daemon keeps the size it started with.
  CHECK(logged(daemon, "SIGHUP: gloo-slice-bytes changed in the configuration; it takes effect when gradsyncd restarts"));
  // Other users are admitted now: both sockets open to them, as if started with --allow-uid.
  CHECK(mode(daemon.socket()) == 0666);
  CHECK(mode(admin_socket(daemon)) == 0666);
  std::string status = status_of(daemon);
  INFO(status);
  CHECK(std::regex_search(status, std::regex(R"(timeout-ms\s+1234\n)")));
  CHECK(std::regex_search(status, std::regex(R"(allow-uid\s+4242,0\n)")));
  CHECK(std::regex_search(status, std::regex(R"(reduce-threads\s+2\n)")));  // still the running values
  CHECK(std::regex_search(status, std::regex(R"(gloo-slice-bytes\s+67108864\n)")));
  // A job formed now gets the new bound (the daemon reports it at join).
  auto client = join(daemon.socket(), unique_job("reload"), 0, 1);
  CHECK(client->job_timeout() == 1234ms);

  write_file(file, "timeout-ms = \"banana\"\n");
  daemon.process().signal(SIGHUP);
  REQUIRE(logged(daemon, "SIGHUP: the configuration was rejected, the old one stays in effect"));
  CHECK_THAT(daemon.log(), Catch::Contains("banana"));
  // Not TOML at all: rejected too, naming the file and line.
  write_file(file, "# comment\ntimeout-ms = 5\nthis is not toml\n");
  daemon.process().signal(SIGHUP);
  REQUIRE(logged(daemon, "SIGHUP: the configuration was rejected", 2));
  CHECK_THAT(daemon.log(), Catch::Contains(file + ":3"));
  // A valid file that another user could have changed: rejected too, the old one stays.
  write_file(file, "timeout-ms = 777\nallow-uid = [0, 1, 2]\n");
  REQUIRE(::chmod(file.c_str(), 0666) == 0);
  daemon.process().signal(SIGHUP);
  REQUIRE(logged(daemon, "SIGHUP: the configuration was rejected", 3));
  CHECK_THAT(daemon.log(), Catch::Contains("is writable by other users (mode 0666)"));
  status = status_of(daemon);
  INFO(status);
  CHECK(std::regex_search(status, std::regex(R"(timeout-ms\s+1234\n)")));
  CHECK(daemon.running());
  client.reset();
  ::unlink(file.c_str());
  ::rmdir(dir);
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("shutdown: SIGTERM lets an operation already submitted finish, refuses new joins, and exits 0",
          "[integration][shutdown]") {
  TestDaemon daemon({"--drain-timeout-ms", "5000"});
  const std::string job = unique_job("drain");
  Latch submitted, go;
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<TensorSpec> specs = {{DType::kFloat32, 100}};
    const TensorSet set = client->register_tensors(client->allocate_flat(specs), {});
    if (rank == 1 && !go.wait(30s)) return fail("never told to go");
    Work work = client->allreduce(set, ReduceOptions{});
    if (rank == 0) submitted.open();
    try {
      if (!work.wait(10s)) return fail("the step did not finish");
    } catch (const Error& e) {
      return fail(std::string("the step submitted before SIGTERM failed: ") + e.what());
    }
    return kOk;
  });
  REQUIRE(submitted.wait(30s));
  // Until the daemon has read rank 0's submission (gradsyncctl inflight lists the operation).
  bool pending = false;
  for (int i = 0; i < 200 && !pending; ++i) {
    pending = gradsyncctl(daemon, "inflight --json").output.find("\"seq\": 1") != std::string::npos;
    if (!pending) std::this_thread::sleep_for(10ms);
  }
  REQUIRE(pending);
  daemon.process().signal(SIGTERM);
  for (int i = 0; i < 100 && daemon.log().find("draining for up to 5000 ms") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  // A new job now is refused, saying why.
  try {
    join(daemon.socket(), unique_job("late"), 0, 1);
    FAIL("a join during the drain was accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("gradsyncd is shutting down"));
  }
  const auto released = std::chrono::steady_clock::now();
  go.open();  // rank 1 submits its part now, after the signal: the step still completes
  for (int s : group.wait_all(30s)) CHECK(exit_code(s) == kOk);
  const int status = daemon.process().wait_for(10s);
  CHECK(exit_code(status) == 0);
  CHECK(std::chrono::steady_clock::now() - released < 5s);  // drained, not timed out
  CHECK_THAT(daemon.log(), Catch::Contains("drained: every operation submitted before the signal finished"));
}

}  // namespace gradsync::test
