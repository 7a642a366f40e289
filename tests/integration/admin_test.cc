// The admin service and gradsyncctl against a real gradsyncd with real clients: status, jobs
// and clients as tables and JSON; a stalled job whose in-flight view names the rank that has
// not submitted and the rank and bucket not marked ready; access refused to a user the daemon
// does not allow; a daemon that is not there; bad usage. Each failure has its exit status.
#include <catch2/catch.hpp>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <regex>
#include <string>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;


const std::vector<TensorSpec> kSpecs = {{DType::kFloat32, 1000}, {DType::kFloat32, 1000}, {DType::kFloat32, 1000},
                                        {DType::kFloat32, 1000}};

}  // namespace

TEST_CASE("admin: status, jobs and clients of a live daemon, as tables and JSON", "[integration][admin]") {
  TestDaemon daemon;
  const std::string job = unique_job("admin-list");
  Latch listed[2];  // one per client: a latch wakes one waiter
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    if (!client->allreduce(set, ReduceOptions{}).wait(10s)) return fail("step timed out");
    return listed[rank].wait(60s) ? kOk : fail("the test never listed");
  });
  // Until both joined, registered and stepped.
  for (int i = 0; i < 200; ++i) {
    if (gradsyncctl(daemon, "jobs --json").output.find("\"operationsDone\": 1") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  const CommandRun jobs = gradsyncctl(daemon, "jobs");
  INFO(jobs.output);
  CHECK(jobs.code == 0);
  CHECK_THAT(jobs.output, Catch::Contains("JOB") && Catch::Contains(job) && Catch::Contains("running") &&
                              Catch::Contains("0,1") && Catch::Contains("31.2 KiB"));  // 2 ranks x 16000 bytes
  const CommandRun json = gradsyncctl(daemon, "jobs --json");
  INFO(json.output);
  CHECK(json.code == 0);
  CHECK_THAT(json.output, Catch::Contains("\"id\": \"" + job + "\"") && Catch::Contains("\"operationsDone\": 1") &&
                              Catch::Contains("\"registeredBytes\": 32000"));
  const CommandRun clients = gradsyncctl(daemon, "clients");
  INFO(clients.output);
  CHECK(clients.code == 0);
  CHECK_THAT(clients.output, Catch::Contains(std::to_string(group.pid(0))) &&
                                 Catch::Contains(std::to_string(group.pid(1))) && Catch::Contains("joined"));
  const CommandRun status = gradsyncctl(daemon, "status");
  INFO(status.output);
  CHECK(status.code == 0);
  CHECK_THAT(status.output, Catch::Contains("gradsyncd 0.") && Catch::Contains("jobs: 1, clients: 2") &&
                                Catch::Contains("timeout-ms") && Catch::Contains("host memfd"));
  CHECK(std::regex_search(gradsyncctl(daemon, "status --json").output, std::regex(R"("uptimeMs": \d+,)")));
  // --watch redraws a terminal only: into a pipe, rounds follow each other with no escapes.
  const CommandRun watched = run_command("timeout 1 " + std::string(GRADSYNCCTL_BINARY) + " --admin unix:" +
                                         admin_socket(daemon) + " --watch 0.2 jobs 2>&1 | cat");
  CHECK_THAT(watched.output, Catch::Contains("JOB ") && !Catch::Contains("\033["));
  for (const Latch& l : listed) l.open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

TEST_CASE("admin: inflight names the rank and the bucket that hold a stalled job", "[integration][admin]") {
  TestDaemon daemon({"--timeout-ms", "30000"});
  const std::string job = unique_job("admin-stall");
  Latch seen[2];
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), RegisterOptions{1 << 12});
    Work work = client->allreduce_deferred(set, ReduceOptions{});
    // One tensor per bucket, launched in order 0, 1, 2, 3; rank 1 never marks tensor 2.
    for (uint32_t t = 0; t < 4; ++t) {
      if (rank == 1 && t == 2) continue;
      client->mark_ready(set, t);
    }
    return seen[rank].wait(60s) ? kOk : fail("the test never saw the stall");
  });
  // Exactly one bucket waits, for rank 1 (its tensor 2); the later buckets wait behind it,
  // every rank having marked them. Asked until the ranks have got that far (a snapshot taken
  // while rank 1 is still marking shows more buckets waiting for it).
  const std::regex not_ready_on_1(R"("ranksNotReady": \[\s*1\s*\])");
  const auto waiting_for_1 = [&](const std::string& text) {
    return std::distance(std::sregex_iterator(text.begin(), text.end(), not_ready_on_1), std::sregex_iterator());
  };
  CommandRun inflight;
  for (int i = 0; i < 200; ++i) {
    inflight = gradsyncctl(daemon, "inflight --json " + job);
    if (waiting_for_1(inflight.output) == 1 && inflight.output.find("\"ranksNotSubmitted\": []") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  INFO(inflight.output);
  CHECK(inflight.code == 0);
  CHECK(waiting_for_1(inflight.output) == 1);
  CHECK_THAT(inflight.output, Catch::Contains("\"ranksNotSubmitted\": []"));
  const CommandRun table = gradsyncctl(daemon, "inflight " + job);
  INFO(table.output);
  CHECK(table.code == 0);
  CHECK(std::regex_search(table.output, std::regex(R"(\n\s+1\s+allreduce\(avg, divide after\) on set 0\s+\d+ ms\s+-\s+\d\s+dp\s+3\.9 KiB\s+1\n)")));
  const CommandRun unknown = gradsyncctl(daemon, "inflight no-such-job");
  CHECK(unknown.code == 1);
  CHECK_THAT(unknown.output, Catch::Contains("no job 'no-such-job'"));
  for (const Latch& l : seen) l.open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

TEST_CASE("admin: a user not allowed on the daemon is refused, with its own exit status", "[integration][admin]") {
  passwd* entry = ::getpwnam("gradsync-test");
  if (!entry) REQUIRE(std::system("useradd --system --no-create-home --shell /usr/sbin/nologin gradsync-test >/dev/null 2>&1") == 0);
  entry = ::getpwnam("gradsync-test");
  REQUIRE(entry != nullptr);
  const std::string uid = std::to_string(entry->pw_uid);
  // A daemon for its own user and root only: its sockets are closed to others.
  TestDaemon closed;
  open_socket_folder(closed);
  const CommandRun shut_out = gradsyncctl(closed, "jobs", uid);
  INFO(shut_out.output);
  CHECK(shut_out.code == 4);
  CHECK_THAT(shut_out.output, Catch::Contains("access denied") && Catch::Contains("--allow-uid"));
  // A daemon open to another user: the socket opens, and the call is refused by uid.
  TestDaemon daemon({"--allow-uid", "54321"});
  open_socket_folder(daemon);
  const CommandRun refused = gradsyncctl(daemon, "jobs", uid);
  INFO(refused.output);
  CHECK(refused.code == 4);
  CHECK_THAT(refused.output, Catch::Contains("access denied") &&
                                 Catch::Contains("uid " + std::to_string(entry->pw_uid) + " is not allowed") &&
                                 Catch::Contains("--allow-uid"));
  TestDaemon open_to_it({"--allow-uid", std::to_string(entry->pw_uid)});
  open_socket_folder(open_to_it);
  const CommandRun allowed = gradsyncctl(open_to_it, "jobs", std::to_string(entry->pw_uid));
  INFO(allowed.output);
  CHECK(allowed.code == 0);
}

TEST_CASE("admin: no daemon, and bad usage, each with its exit status", "[integration][admin]") {
  const auto ctl_at = [](const std::string& admin, const std::string& args) {
    return run_command(std::string(GRADSYNCCTL_BINARY) + " --admin unix:" + admin + " " + args);
  };
  const CommandRun absent = ctl_at("/tmp/gradsync-no-such-daemon/admin.sock", "status");
  CHECK(absent.code == 3);
  CHECK_THAT(absent.output, Catch::Contains("cannot reach gradsyncd at unix:/tmp/gradsync-no-such-daemon/admin.sock"));
  const CommandRun bad = ctl_at("/tmp/x.sock", "frobnicate");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.output, Catch::Contains("unknown command 'frobnicate'") && Catch::Contains("Usage: gradsyncctl"));
  CHECK(ctl_at("/tmp/x.sock", "jobs --watch 0").code == 2);
  CHECK(ctl_at("/tmp/x.sock", "--help").code == 0);
}

// The two sockets sit side by side, and a newcomer points a program at the wrong one. Each side
// recognises the other's protocol and names the socket it needs (was: a trainer got "frame of
// 69074944 bytes exceeds the limit", and gradsyncctl told root "access denied").
TEST_CASE("admin: a trainer pointed at the admin socket and gradsyncctl at the control socket each name the right one",
          "[integration][admin]") {
  TestDaemon daemon;
  const std::string admin = admin_socket(daemon);
  try {
    Client::connect(ConnectOptions{admin});
    FAIL("a client joined through the admin socket");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(e.status().message(), Catch::Contains(admin + " is not gradsyncd's control socket") &&
                                         Catch::Contains("the control socket: " + daemon.socket()));
  }
  const CommandRun crossed =
      run_command(std::string(GRADSYNCCTL_BINARY) + " --admin unix:" + daemon.socket() + " status");
  INFO(crossed.output);
  CHECK(crossed.code == 2);
  CHECK_THAT(crossed.output, Catch::Contains(daemon.socket() + " is not gradsyncd's admin socket") &&
                                 Catch::Contains("--admin unix:" + admin));
  CHECK_THAT(crossed.output, !Catch::Contains("access denied"));
  // Given only the trainers' socket, gradsyncctl finds the admin socket beside it.
  const CommandRun derived =
      run_command("env -u GRADSYNC_ADMIN GRADSYNC_SOCKET=" + daemon.socket() + " " + GRADSYNCCTL_BINARY + " status");
  INFO(derived.output);
  CHECK(derived.code == 0);
  CHECK_THAT(derived.output, Catch::Contains("gradsyncd "));
  check_still_serving(daemon);
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("admin: stats shows a straggler's readiness lag while the job runs", "[integration][admin]") {
  TestDaemon daemon;
  const std::string job = unique_job("admin-stats");
  Latch done[2];
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const TensorSet set = client->register_tensors(client->allocate_flat(kSpecs), {});
    for (int step = 0; step < 5; ++step) {
      if (rank == 1) std::this_thread::sleep_for(120ms);  // the straggler
      if (!client->allreduce(set, ReduceOptions{}).wait(10s)) return fail("step timed out");
    }
    return done[rank].wait(60s) ? kOk : fail("the test never looked");
  });
  CommandRun stats;
  for (int i = 0; i < 200; ++i) {
    stats = gradsyncctl(daemon, "stats " + job);
    if (stats.output.find(" 5 operations") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  INFO(stats.output);
  CHECK(stats.code == 0);
  CHECK_THAT(stats.output, Catch::Contains(" 5 operations, 5 buckets, 78.1 KiB reduced"));
  // Rank 1 makes every bucket ready about 120 ms after rank 0: the 100-300 ms bucket.
  CHECK(std::regex_search(stats.output, std::regex(R"(rank 1 readiness lag\s+p50 <= 300 ms, p99 <= 300 ms \(n 5\))")));
  CHECK(std::regex_search(stats.output, std::regex(R"(rank 0 readiness lag\s+p50 <= 10 us)")));
  CHECK(std::regex_search(stats.output, std::regex(R"(operation latency\s+p50 <= 300 ms)")));
  const CommandRun json = gradsyncctl(daemon, "stats --json " + job);
  CHECK(json.code == 0);
  CHECK_THAT(json.output, Catch::Contains("\"readinessLag\"") && Catch::Contains("\"boundsSeconds\""));
  // Numbers are JSON numbers, 64-bit ones too (protobuf's printer made them strings), and the
  // unbounded histogram edge is "+Inf" (it was 1e+300).
  CHECK(std::regex_search(json.output, std::regex(R"("operations": 5\b)")));
  CHECK_THAT(json.output, Catch::Contains("\"+Inf\"") && !Catch::Contains("e+300"));
  for (const Latch& l : done) l.open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("admin: a daemon whose io thread hangs is reported as such, with its own exit status",
          "[integration][admin]") {
  ::setenv("GRADSYNCD_TEST_HANG_IO_AFTER_MS", "300", 1);
  TestDaemon daemon;
  ::unsetenv("GRADSYNCD_TEST_HANG_IO_AFTER_MS");
  for (int i = 0; i < 100 && daemon.log().find("blocking the io thread") == std::string::npos; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  const CommandRun jobs = gradsyncctl(daemon, "jobs");
  INFO(jobs.output);
  CHECK(jobs.code == 5);
  CHECK_THAT(jobs.output, Catch::Contains("io thread did not answer within 2000 ms (busy, or hung)"));
  // The process is stuck for good; the test daemon's teardown kills it.
  daemon.process().signal(SIGKILL);
}

}  // namespace gradsync::test

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

namespace gradsync::test {
namespace {

// One request and its first reply on `method`, as raw bytes, through gRPC's generic stub: the
// health and reflection services have no generated stubs in the packaged gRPC.
bool generic_call(const std::string& target, const std::string& method, const std::string& request,
                  std::string* reply) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(&context, method, &queue);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* expected) { return queue.Next(&tag, &ok) && tag == expected && ok; };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(reinterpret_cast<void*>(1))) return false;
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->WriteLast(out, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  if (!step(reinterpret_cast<void*>(2))) return false;
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  if (!step(reinterpret_cast<void*>(3))) return false;
  std::vector<grpc::Slice> slices;
  if (!in.Dump(&slices).ok()) return false;
  reply->clear();
  for (const auto& s : slices) reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  step(reinterpret_cast<void*>(4));
  return true;
}

}  // namespace

TEST_CASE("admin: the standard health and reflection services answer on the admin socket", "[integration][admin]") {
  TestDaemon daemon;
  const std::string target = "unix:" + admin_socket(daemon);
  std::string reply;
  // HealthCheckRequest{service: ""} is empty; the reply is HealthCheckResponse{status: SERVING}.
  REQUIRE(generic_call(target, "/grpc.health.v1.Health/Check", "", &reply));
  CHECK(reply == std::string("\x08\x01", 2));
  // ServerReflectionRequest{list_services: ""} (field 7): the reply names the admin service.
  REQUIRE(generic_call(target, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                       std::string("\x3a\x00", 2), &reply));
  CHECK_THAT(reply, Catch::Contains("gradsync.admin.v1.Admin") && Catch::Contains("grpc.health.v1.Health"));
}

}  // namespace gradsync::test
