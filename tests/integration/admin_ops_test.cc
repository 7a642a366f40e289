// The admin service's mutating calls and its views across nodes, against real gradsyncd
// processes and real clients: a settings change agreed by 3 daemons mid-training (every element
// still exact, the buckets changed on every node from one operation), SetConfig and Drain
// refused to an unprivileged user and allowed to the admin group, a drain that refuses new jobs
// and lets running ones end, a Chrome trace of the last operations, and GetInFlight naming
// another node that holds a job: one waiting for its rank, then one frozen.
#include <catch2/catch.hpp>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "tests/integration/harness.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;

// Values whose sums over six ranks are exact in float32, different per rank, tensor, element
// and step.
float value(int rank, int tensor, uint64_t i, int step) {
  return static_cast<float>((rank * 131 + tensor * 17 + static_cast<int>(i % 251) * 3 + step * 7) % 1024);
}

// The lines of `log` that say from which operation new settings apply.
std::set<std::string> applied_from(const std::string& log) {
  std::set<std::string> found;
  const std::regex line(R"(from operation (\d+): bucket cap 16384 bytes)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
    found.insert((*it)[1]);
  }
  return found;
}

}  // namespace

TEST_CASE("admin: a settings change mid-training takes effect at one operation on all 3 daemons, every element exact",
          "[integration][admin][multinode]") {
  constexpr int kNodes = 3, kLocal = 2, kWorld = kNodes * kLocal, kTensors = 8, kSteps = 40;
  constexpr uint64_t kElements = 4096;  // 16 KiB per tensor: one bucket before, eight after
  TestCluster cluster(kNodes, {"--timeout-ms", "20000"});
  const std::string job = unique_job("admin-setconfig");
  Latch halfway, finished, looked;
  ClientGroup group(kWorld, [&](int rank) {
    auto client = join_nodes(cluster.node(rank / kLocal).socket(), job, rank, kWorld, kLocal, cluster.rendezvous());
    std::vector<TensorSpec> specs(kTensors, TensorSpec{DType::kFloat32, kElements, "dp"});
    std::vector<SharedTensor> tensors = client->allocate_flat(specs);
    const TensorSet set = client->register_tensors(tensors, {});
    for (int step = 0; step < kSteps; ++step) {
      for (int t = 0; t < kTensors; ++t) {
        auto* data = reinterpret_cast<float*>(tensors[static_cast<size_t>(t)].data());
        for (uint64_t i = 0; i < kElements; ++i) data[i] = value(rank, t, i, step);
      }
      if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(20s)) return fail("step timed out");
      for (int t = 0; t < kTensors; ++t) {
        const auto* data = reinterpret_cast<const float*>(tensors[static_cast<size_t>(t)].data());
        for (uint64_t i = 0; i < kElements; ++i) {
          float want = 0;
          for (int r = 0; r < kWorld; ++r) want += value(r, t, i, step);
          if (data[i] != want) {
            return fail("step " + std::to_string(step) + " tensor " + std::to_string(t) + " element " +
                        std::to_string(i) + ": " + std::to_string(data[i]) + " != " + std::to_string(want));
          }
        }
      }
      if (rank == 0 && step == 10) halfway.open();
      std::this_thread::sleep_for(20ms);
    }
    if (rank == 0) finished.open();
    return looked.wait(120s) ? kOk : fail("the test never looked");
  });
  REQUIRE(halfway.wait(60s));
  // Any node may take the change: here node 1, which is not the rendezvous.
  const CommandRun set = gradsyncctl(cluster.node(1), "config set bucket-cap-bytes=16384 timeout-ms=15000");
  INFO(set.output);
  CHECK(set.code == 0);
  std::smatch from;
  REQUIRE(std::regex_search(set.output, from, std::regex(R"(new settings from operation (\d+) on every node)")));
  CHECK(finished.wait(120s));
  // Every node switched at the operation the change named, and only there.
  for (int n = 0; n < kNodes; ++n) {
    INFO("node " << n << ":\n" << cluster.node(n).log());
    CHECK(applied_from(cluster.node(n).log()) == std::set<std::string>{from[1].str()});
  }
  // And the later operations ran eight buckets of 16 KiB on every node, through the collective.
  for (int n = 0; n < kNodes; ++n) {
    const CommandRun stats = gradsyncctl(cluster.node(n), "stats --json " + job);
    INFO(stats.output);
    CHECK(stats.code == 0);
    CHECK_THAT(stats.output, Catch::Contains("\"bucket\": 7") && Catch::Contains("\"waitingForPeers\"") &&
                                 Catch::Contains("\"collective\""));
    const CommandRun table = gradsyncctl(cluster.node(n), "stats " + job);
    INFO(table.output);
    CHECK(std::regex_search(table.output, std::regex(R"(collective across nodes\s+p50 <= )")));
    CHECK(std::regex_search(table.output, std::regex(R"(waiting for other nodes\s+p50 <= )")));
  }
  for (int r = 0; r < kWorld; ++r) looked.open();
  for (int s : group.wait_all(120s)) CHECK(exit_code(s) == kOk);
}

// Every setting gradsyncd takes, shown by `config get` (limits, metrics and the drain timeout
// were missing): the names are taken from `gradsyncd --help`, so a new flag must be shown too.
TEST_CASE("admin: config get shows every setting gradsyncd --help lists", "[integration][admin]") {
  TestDaemon daemon({"--metrics", "127.0.0.1:0", "--drain-timeout-ms", "1500"});
  const CommandRun help = run_command(std::string(GRADSYNCD_BINARY) + " --help");
  const std::string settings = help.output.substr(help.output.find("Settings"));
  const CommandRun config = gradsyncctl(daemon, "config get");
  INFO(config.output);
  REQUIRE(config.code == 0);
  size_t checked = 0;
  const std::regex flag(R"(\n  --([a-z0-9-]+))");
  for (auto it = std::sregex_iterator(settings.begin(), settings.end(), flag); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1].str();
    INFO(name);
    CHECK(std::regex_search(config.output, std::regex("(^|\n)" + name + "\\s")));
    ++checked;
  }
  CHECK(checked >= 40);
  CHECK(std::regex_search(config.output, std::regex(R"(drain-timeout-ms\s+1500)")));
  CHECK(std::regex_search(config.output, std::regex(R"(metrics\s+127\.0\.0\.1:0)")));
  CHECK_THAT(config.output, Catch::Contains("from physical memory"));
}

TEST_CASE("admin: config set and its errors on a single node", "[integration][admin]") {
  TestDaemon daemon;
  const CommandRun level = gradsyncctl(daemon, "config set log-level=debug");
  INFO(level.output);
  CHECK(level.code == 0);
  CHECK_THAT(level.output, Catch::Contains("log level: debug"));
  const CommandRun get = gradsyncctl(daemon, "config get");
  CHECK(get.code == 0);
  CHECK(std::regex_search(get.output, std::regex(R"(log-level\s+debug)")));
  const CommandRun unknown = gradsyncctl(daemon, "config set frobs=3");
  CHECK(unknown.code == 2);
  CHECK_THAT(unknown.output, Catch::Contains("unknown setting 'frobs'"));
  const CommandRun bad_level = gradsyncctl(daemon, "config set log-level=loud");
  CHECK(bad_level.code == 1);
  CHECK_THAT(bad_level.output, Catch::Contains("log-level must be debug, info, warning or error, not 'loud'"));
  const CommandRun zero = gradsyncctl(daemon, "config set timeout-ms=0");
  CHECK(zero.code == 1);
  CHECK_THAT(zero.output, Catch::Contains("timeout_ms must be between 1 and --max-timeout-ms"));
  const CommandRun no_job = gradsyncctl(daemon, "config set --job nope timeout-ms=100");
  CHECK(no_job.code == 1);
  CHECK_THAT(no_job.output, Catch::Contains("no job 'nope'"));
  // A single-node job takes a change at its next operation: its buckets split from there.
  const std::string job = unique_job("admin-cap");
  Latch changed[2], looked[2];
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    std::vector<TensorSpec> specs(4, TensorSpec{DType::kFloat32, 1024});
    std::vector<SharedTensor> tensors = client->allocate_flat(specs);
    const TensorSet set = client->register_tensors(tensors, {});
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(10s)) return fail("step timed out");
    if (!changed[rank].wait(60s)) return fail("the test never changed the settings");
    for (auto& t : tensors) {
      auto* data = reinterpret_cast<float*>(t.data());
      for (uint64_t i = 0; i < t.numel(); ++i) data[i] = static_cast<float>(rank + 1);
    }
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(10s)) return fail("step timed out");
    for (auto& t : tensors) {
      const auto* data = reinterpret_cast<const float*>(t.data());
      for (uint64_t i = 0; i < t.numel(); ++i) {
        if (data[i] != 3.0f) return fail("wrong sum after the change");
      }
    }
    return looked[rank].wait(60s) ? kOk : fail("the test never looked");
  });
  for (int i = 0; i < 200; ++i) {
    if (gradsyncctl(daemon, "jobs --json").output.find("\"operationsDone\": 1") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  const CommandRun cap = gradsyncctl(daemon, "config set --job " + job + " bucket-cap-bytes=4096");
  INFO(cap.output);
  CHECK(cap.code == 0);
  CHECK_THAT(cap.output, Catch::Contains("new settings from operation 2"));
  for (const Latch& l : changed) l.open();
  CommandRun stats;
  for (int i = 0; i < 200; ++i) {
    stats = gradsyncctl(daemon, "stats --json " + job);
    if (stats.output.find("\"operations\": 2") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  INFO(stats.output);
  // Operation 1 ran one bucket of 16 KiB, operation 2 four of 4 KiB.
  CHECK_THAT(stats.output, Catch::Contains("\"bucket\": 3") && Catch::Contains("\"buckets\": 5"));
  for (const Latch& l : looked) l.open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

TEST_CASE("admin: SetConfig and Drain are refused to an unprivileged user and allowed to the admin group",
          "[integration][admin]") {
  const uid_t uid = test_user().uid;
  const std::string user = std::to_string(uid);
  TestDaemon daemon({"--allow-uid", user});
  open_socket_folder(daemon);
  const CommandRun set = gradsyncctl(daemon, "config set log-level=error", user);
  INFO(set.output);
  CHECK(set.code == 4);
  CHECK_THAT(set.output, Catch::Contains("SetConfig changes the daemon") && Catch::Contains("--admin-group") &&
                             Catch::Contains("uid " + user + " is none of them"));
  const CommandRun drain = gradsyncctl(daemon, "drain", user);
  CHECK(drain.code == 4);
  CHECK_THAT(drain.output, Catch::Contains("Drain changes the daemon"));
  // Reading is still open to it, and the level did not change.
  const CommandRun get = gradsyncctl(daemon, "config get", user);
  CHECK(get.code == 0);
  INFO(get.output);
  CHECK(std::regex_search(get.output, std::regex(R"(log-level\s+debug)")));  // the test daemons' level

  // The same user as a member of the daemon's admin group may.
  if (!::getgrnam("gradsync-test-admins")) REQUIRE(std::system("groupadd --system gradsync-test-admins") == 0);
  REQUIRE(std::system("usermod -aG gradsync-test-admins gradsync-test") == 0);
  TestDaemon admin_group({"--allow-uid", user, "--admin-group", "gradsync-test-admins"});
  open_socket_folder(admin_group);
  const CommandRun allowed = gradsyncctl(admin_group, "config set log-level=warning", user);
  INFO(allowed.output);
  CHECK(allowed.code == 0);
  CHECK_THAT(allowed.output, Catch::Contains("log level: warning"));
  CHECK(gradsyncctl(admin_group, "drain --cancel", user).code == 0);
}

// An allowed but unprivileged user reads its own jobs only: status counts none of root's, and
// stats of root's job id answers exactly as for an id nobody uses (no oracle for existence).
TEST_CASE("admin: an unprivileged user's status and stats show nothing of another user's jobs",
          "[integration][admin]") {
  const std::string user = std::to_string(test_user().uid);
  TestDaemon daemon({"--allow-uid", "0", "--allow-uid", user});
  open_socket_folder(daemon);
  const std::string job = unique_job("admin-private");
  Latch looked;
  ClientGroup group(1, [&](int) {
    auto client = join(daemon.socket(), job, 0, 1);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 64}}), {});
    if (!client->allreduce(set, ReduceOptions{}).wait(10s)) return fail("step timed out");
    return looked.wait(60s) ? kOk : fail("the test never looked");
  });
  for (int i = 0; i < 200; ++i) {
    if (gradsyncctl(daemon, "jobs --json").output.find("\"operationsDone\": 1") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  const std::string& id = job;  // root's job
  const CommandRun root_status = gradsyncctl(daemon, "status");
  CHECK_THAT(root_status.output, Catch::Contains("jobs: 1, clients: 1"));
  CHECK(gradsyncctl(daemon, "stats " + id).code == 0);
  const CommandRun status = gradsyncctl(daemon, "status", user);
  INFO(status.output);
  CHECK(status.code == 0);
  CHECK_THAT(status.output, Catch::Contains("jobs: 0, clients: 0"));
  const CommandRun theirs = gradsyncctl(daemon, "stats " + id, user);
  const CommandRun nobodys = gradsyncctl(daemon, "stats no-such-" + job, user);
  INFO(theirs.output << "\n" << nobodys.output);
  CHECK(theirs.code != 0);
  CHECK(theirs.code == nobodys.code);
  CHECK_THAT(theirs.output, Catch::Contains("no job '" + id + "' of uid " + user));
  looked.open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

// The review's flood: one allowed user holding admin connections without end (each a
// descriptor the daemon hands to gRPC). A user may hold 16; more are closed at once, others'
// calls go on, and the user's own work again once it lets go.
TEST_CASE("admin: one user's admin connections are capped, and others' calls go on", "[integration][admin]") {
  const TestUser flooder = test_user();
  const std::string user = std::to_string(flooder.uid);
  TestDaemon daemon({"--allow-uid", "0", "--allow-uid", user});
  open_socket_folder(daemon);
  const std::string path = admin_socket(daemon);
  Latch counted, release;
  ClientGroup flood(1, [&](int) {
    if (!become(flooder)) return fail("cannot become the test user");
    std::vector<int> fds;
    for (int i = 0; i < 20; ++i) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return fail("connect failed");
      fds.push_back(fd);
      std::this_thread::sleep_for(10ms);  // accepted in order
    }
    std::this_thread::sleep_for(500ms);
    int closed = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      pollfd p{fds[i], POLLIN, 0};
      char byte;
      const bool gone = ::poll(&p, 1, 0) > 0 && ::recv(fds[i], &byte, 1, MSG_DONTWAIT) == 0;
      if (gone != (i >= 16)) return fail("connection " + std::to_string(i) + (gone ? " was closed" : " stayed open"));
      closed += gone;
    }
    counted.open();
    if (!release.wait(60s)) return fail("never released");
    for (int fd : fds) ::close(fd);
    return closed == 4 ? kOk : fail("closed " + std::to_string(closed));
  });
  REQUIRE(counted.wait(30s));
  CHECK(gradsyncctl(daemon, "status").code == 0);  // root's calls go on
  CHECK(gradsyncctl(daemon, "status", user).code != 0);  // the flooder is at its cap
  CHECK_THAT(daemon.log(), Catch::Contains("already holds 16 admin connections, the limit per user"));
  release.open();
  CHECK(exit_code(flood.wait(0, 30s)) == kOk);
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {
    served = gradsyncctl(daemon, "status", user).code == 0;
    if (!served) std::this_thread::sleep_for(100ms);
  }
  CHECK(served);  // its connections gone, the user is served again
}

TEST_CASE("admin: drain refuses new jobs, lets running ones end, and --cancel accepts them again", "[integration][admin]") {
  TestDaemon daemon;
  const std::string job = unique_job("admin-drain");
  Latch release;
  ClientGroup group(1, [&](int) {
    auto client = join(daemon.socket(), job, 0, 1);
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 64}}), {});
    if (!client->allreduce(set, ReduceOptions{}).wait(10s)) return fail("step timed out");
    if (!release.wait(60s)) return fail("never released");
    // A running job keeps working while the daemon drains.
    return client->allreduce(set, ReduceOptions{}).wait(10s) ? kOk : fail("step during drain timed out");
  });
  for (int i = 0; i < 200; ++i) {
    if (gradsyncctl(daemon, "jobs --json").output.find("\"operationsDone\": 1") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  const CommandRun busy = gradsyncctl(daemon, "drain --timeout 0.3");
  INFO(busy.output);
  CHECK(busy.code == 6);
  CHECK_THAT(busy.output, Catch::Contains("refuses new jobs; 1 still there") && Catch::Contains("0." + job));
  try {
    join(daemon.socket(), unique_job("admin-drain-new"), 0, 1);
    FAIL("a new job was accepted while draining");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("draining"));
  }
  release.open();
  CHECK(exit_code(group.wait(0, 60s)) == kOk);
  const CommandRun drained = gradsyncctl(daemon, "drain --timeout 10");
  INFO(drained.output);
  CHECK(drained.code == 0);
  CHECK_THAT(drained.output, Catch::Contains("drained"));
  CHECK(gradsyncctl(daemon, "drain --cancel").code == 0);
  auto client = join(daemon.socket(), unique_job("admin-drain-after"), 0, 1);
  CHECK(client != nullptr);
}

TEST_CASE("admin: trace writes the last operations as Chrome trace JSON, a track per rank and per group",
          "[integration][admin]") {
  TestDaemon daemon;
  const std::string job = unique_job("admin-trace");
  Latch traced[2];
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    std::vector<TensorSpec> specs(4, TensorSpec{DType::kFloat32, 1024});
    const TensorSet set = client->register_tensors(client->allocate_flat(specs), RegisterOptions{4096});
    for (int step = 0; step < 6; ++step) {
      if (!client->allreduce(set, ReduceOptions{}).wait(10s)) return fail("step timed out");
    }
    return traced[rank].wait(60s) ? kOk : fail("the test never traced");
  });
  for (int i = 0; i < 200; ++i) {
    if (gradsyncctl(daemon, "jobs --json").output.find("\"operationsDone\": 6") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  const std::string file = daemon.socket() + ".trace.json";
  const CommandRun trace = gradsyncctl(daemon, "trace -o " + file + " --last 3 " + job);
  INFO(trace.output);
  CHECK(trace.code == 0);
  CHECK_THAT(trace.output, Catch::Contains("3 operations traced written to " + file));
  // Valid JSON, as Perfetto reads it: 3 operations, 4 buckets each on the group's track, and
  // each rank's track with a slice per bucket it made ready.
  const CommandRun check = run_command(
      "/usr/bin/python3 -c \"import json,sys,collections; d=json.load(open(sys.argv[1])); e=d['traceEvents'];"
      "names={x['args']['name'] for x in e if x['ph']=='M' and x['name']=='thread_name'};"
      "ops=[x['name'] for x in e if x['ph']=='X' and x['tid']==0];"
      "per=collections.Counter(x['tid'] for x in e if x['ph']=='X');"
      "print(sorted(names)); print(ops); print(sorted(per.items()))\" " + file);
  INFO(check.output);
  CHECK(check.code == 0);
  CHECK_THAT(check.output, Catch::Contains("'execution: group dp'") && Catch::Contains("'operations'") &&
                               Catch::Contains("'rank 0'") && Catch::Contains("'rank 1'"));
  CHECK_THAT(check.output, Catch::Contains("['op 4 allreduce(avg, divide after) on set 0', 'op 5 allreduce(avg, "
                                           "divide after) on set 0', 'op 6 allreduce(avg, divide after) on set 0']"));
  CHECK_THAT(check.output, Catch::Contains("[(0, 3), (1, 12), (2, 12), (100000, 12)]"));
  CHECK(gradsyncctl(daemon, "trace " + job).code == 2);  // no -o
  CHECK(gradsyncctl(daemon, "trace -o " + file + " no-such-job").code == 1);
  for (const Latch& l : traced) l.open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

TEST_CASE("admin: inflight names the other node that holds a job: waiting for its rank, then frozen",
          "[integration][admin][multinode]") {
  TestCluster cluster(2, {"--timeout-ms", "30000"});
  const std::string job = unique_job("admin-nodes");
  Latch stall, stalled_done;
  ClientGroup group(4, [&](int rank) {
    auto client = join_nodes(cluster.node(rank / 2).socket(), job, rank, 4, 2, cluster.rendezvous());
    const TensorSet set = client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 1 << 12, "dp"}}), {});
    if (!client->allreduce(set, ReduceOptions{}).wait(20s)) return fail("step timed out");
    // Rank 3 (node 1) stops submitting; the others submit operation 2 and wait in it.
    if (rank == 3) return stall.wait(120s) ? kOk : fail("never released");
    try {
      client->allreduce(set, ReduceOptions{}).wait(120s);
    } catch (const Error&) {
    }
    return stalled_done.wait(120s) ? kOk : fail("never released");
  });
  CommandRun waiting;
  for (int i = 0; i < 200; ++i) {
    // Until node 0 itself is at operation 2 (it may still be finishing operation 1, which
    // node 1 has passed) and node 1 has rank 2's submission of it (until then node 1 is
    // still "idle, 1 operations done").
    waiting = gradsyncctl(cluster.node(0), "inflight " + job);
    if (waiting.output.find("is not reached by") != std::string::npos &&
        waiting.output.find("at operation 2") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  INFO(waiting.output);
  CHECK(waiting.code == 0);
  CHECK(std::regex_search(waiting.output, std::regex(R"(operation 2, bucket 0 is not reached by:\n\s+node 1 \(\S+\): at operation 2, bucket 0 \(waiting for its local ranks\))")));
  // Node 1 itself names its rank 3.
  const CommandRun local = gradsyncctl(cluster.node(1), "inflight --json " + job);
  INFO(local.output);
  CHECK(std::regex_search(local.output, std::regex(R"("ranksNotSubmitted": \[\s*3\s*\])")));
  // Node 1's daemon freezes: node 0 reports it unreachable within the probe bound.
  cluster.node(1).process().signal(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  const CommandRun frozen = gradsyncctl(cluster.node(0), "inflight " + job);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cluster.node(1).process().signal(SIGCONT);
  INFO(frozen.output);
  CHECK(frozen.code == 0);
  CHECK(std::regex_search(frozen.output, std::regex(R"(not reached by:\n\s+node 1 \(\S+\): unreachable: )")));
  CHECK(seconds < 5.0);
  const CommandRun json = gradsyncctl(cluster.node(0), "inflight --json " + job);
  CHECK_THAT(json.output, Catch::Contains("\"nodesBehind\"") && Catch::Contains("\"node\": 1"));
  stall.open();
  for (int i = 0; i < 3; ++i) stalled_done.open();
  group.wait_all(60s);
}

}  // namespace gradsync::test

namespace gradsync::test {
namespace {

// The daemon's certificate (for 127.0.0.1), client certificates named `ops` (listed as an
// administrator), `gradsync-test` (a local user), `nobody-here` (neither), `root`, and one
// from a CA the daemon does not trust.
void make_admin_certificates(const std::string& dir) {
  make_certificates(dir, {{"server", "gradsyncd", "subjectAltName=IP:127.0.0.1"},
                          {"ops", "ops", "extendedKeyUsage=clientAuth"},
                          {"user", "gradsync-test", "extendedKeyUsage=clientAuth"},
                          {"stranger", "nobody-here", "extendedKeyUsage=clientAuth"},
                          {"rootcert", "root", "extendedKeyUsage=clientAuth"},
                          {"rogueclient", "ops", "extendedKeyUsage=clientAuth", "rogue"}});
}

// The standard health check over TLS with `who`'s certificate: true when it answers SERVING.
bool tls_health_check(const std::string& address, const std::string& dir, const std::string& who) {
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read(dir + "/ca.crt");
  ssl.pem_private_key = read(dir + "/" + who + ".key");
  ssl.pem_cert_chain = read(dir + "/" + who + ".crt");
  auto channel = grpc::CreateChannel(address, grpc::SslCredentials(ssl));
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::CompletionQueue queue;
  grpc::Slice nothing("");
  grpc::ByteBuffer empty(&nothing, 1);
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", empty, &queue);
  call->StartCall();
  grpc::ByteBuffer answer;
  grpc::Status status;
  call->Finish(&answer, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!queue.Next(&tag, &ok) || !ok) return false;
  std::vector<grpc::Slice> slices;
  if (!status.ok()) {
    UNSCOPED_INFO("health check with " << who << "'s certificate: " << status.error_message());
    return false;
  }
  if (!answer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes == std::string("\x08\x01", 2);
}

int free_port() {
  // The port a throwaway listener got; the daemon binds it right after (refusing to share it).
  const CommandRun port = run_command("/usr/bin/python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); "
                                      "print(s.getsockname()[1])\"");
  REQUIRE(port.code == 0);
  return std::stoi(port.output);
}

}  // namespace

TEST_CASE("admin: over TCP with mutual TLS, a certificate is its common name's user or an administrator's",
          "[integration][admin]") {
  const uid_t uid = test_user().uid;
  char dir[] = "/tmp/gradsync-tls-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  make_admin_certificates(dir);
  const std::string d = dir;
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  TestDaemon daemon({"--admin", address, "--admin-tls-cert", d + "/server.crt", "--admin-tls-key", d + "/server.key",
                     "--admin-tls-ca", d + "/ca.crt", "--admin-tls-admin-cn", "ops", "--allow-uid",
                     std::to_string(uid)});
  const auto ctl = [&](const std::string& who, const std::string& args) {
    return run_command(std::string(GRADSYNCCTL_BINARY) + " --admin " + address + " --tls-cert " + d + "/" + who +
                       ".crt --tls-key " + d + "/" + who + ".key --tls-ca " + d + "/ca.crt " + args);
  };
  // The local socket still serves as before.
  CHECK(gradsyncctl(daemon, "status").code == 0);
  // An administrator's certificate may change settings.
  const CommandRun ops = ctl("ops", "config set log-level=warning");
  INFO(ops.output);
  CHECK(ops.code == 0);
  CHECK_THAT(ops.output, Catch::Contains("log level: warning"));
  // A local user's certificate reads as that user, and may not change anything.
  const CommandRun user_reads = ctl("user", "jobs");
  INFO(user_reads.output);
  CHECK(user_reads.code == 0);
  const CommandRun user_sets = ctl("user", "config set log-level=debug");
  INFO(user_sets.output);
  CHECK(user_sets.code == 4);
  CHECK_THAT(user_sets.output, Catch::Contains("SetConfig changes the daemon") &&
                                   Catch::Contains("certificate 'gradsync-test' is none of them"));
  // A certificate naming root reads root's jobs but is not privileged: only listed names are.
  const CommandRun root_sets = ctl("rootcert", "config set log-level=debug");
  INFO(root_sets.output);
  CHECK(root_sets.code == 4);
  CHECK_THAT(root_sets.output, Catch::Contains("certificate 'root' is none of them"));
  CHECK_THAT(daemon.log(), Catch::Contains("SetConfig by certificate 'ops' from ipv4:127.0.0.1:"));
  // A certificate naming nobody, one from another CA, and no certificate at all are refused.
  const CommandRun stranger = ctl("stranger", "jobs");
  CHECK(stranger.code == 4);
  CHECK_THAT(stranger.output, Catch::Contains("'nobody-here' names no user of this node"));
  // Turned away before any service, health included, as the Unix socket does for strangers.
  std::string reply;
  CHECK_FALSE(tls_health_check(address, d, "stranger"));
  CHECK(tls_health_check(address, d, "ops"));
  const CommandRun rogue = ctl("rogueclient", "jobs");
  INFO(rogue.output);
  CHECK(rogue.code == 4);
  CHECK_THAT(rogue.output, Catch::Contains("access denied: TLS with"));
  const CommandRun plain = run_command(std::string(GRADSYNCCTL_BINARY) + " --admin " + address + " jobs");
  CHECK(plain.code == 2);
  CHECK_THAT(plain.output, Catch::Contains("needs mutual TLS"));
  CHECK(daemon.running());
  // TCP without TLS is refused at start, naming what is missing.
  const CommandRun refused = run_command(std::string(GRADSYNCD_BINARY) + " --socket " + d + "/x.sock --admin " +
                                         address + " 2>&1");
  CHECK(refused.code == 2);
  CHECK_THAT(refused.output, Catch::Contains("requires mutual TLS: give --admin-tls-cert, --admin-tls-key and --admin-tls-ca"));
  run_command("rm -rf " + d);
}

}  // namespace gradsync::test
