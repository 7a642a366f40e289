// Multi-node jobs forming through etcd (--rendezvous etcd://...): real gradsyncd processes on
// loopback, one per node, with the demo's trainers checking every element, against a 3-member
// etcd cluster. 3 and 16 nodes; a member killed during formation; TLS and an etcd user through
// the daemons' --etcd-* flags, and a member outside them refused; a daemon killed during
// formation, whose keys go within its lease's TTL.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The demo with `args`, its output and how long it took.
struct DemoRun {
  CommandRun run;
  double seconds = 0;
};
DemoRun demo(const std::string& args) {
  const auto start = Clock::now();
  DemoRun r{run_command(std::string(GRADSYNC_DEMO_BINARY) + " --clients 1 --model tiny --steps 3 " + args), 0};
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// The keys under /gradsync/ in etcd, one per line.
std::string keys(const EtcdCluster& etcd, const std::string& user = {}) {
  return etcd.ctl("get --prefix /gradsync/ --keys-only", user).output;
}

}  // namespace

TEST_CASE("etcd formation: 3 nodes, then 16, form through a 3-member etcd and verify, and only the job's counter (and "
          "its increments' markers) is left in etcd",
          "[etcd]") {
  EtcdCluster etcd(3);
  for (int nodes : {3, 16}) {
    const DemoRun r = demo("--nodes " + std::to_string(nodes) + " --rendezvous etcd://" + etcd.endpoints());
    INFO(r.run.output);
    REQUIRE(r.run.code == 0);
    CHECK_THAT(r.run.output, Catch::Contains("verified: " + std::to_string(nodes) + " node(s)"));
    std::printf("etcd formation: %d nodes formed and verified 3 steps in %.2f s (daemons' start included)\n", nodes,
                r.seconds);
  }
  // Every node left, so the last deleted each generation's keys: what is left is each job's
  // incarnation counter and the markers of its increments, one per node (on a lease of
  // --peer-key-ttl-s).
  std::istringstream left(keys(etcd));
  int counters = 0;
  int markers = 0;
  for (std::string key; std::getline(left, key);) {
    if (key.empty()) continue;
    INFO(key);
    if (key.find("/incarnations/~once/") != std::string::npos) {
      ++markers;
      continue;
    }
    CHECK(key.size() > 13);
    CHECK(key.substr(key.size() - 13) == "/incarnations");
    ++counters;
  }
  CHECK(counters == 2);
  CHECK(markers == 3 + 16);
}

TEST_CASE("etcd formation: a member killed while 16 nodes form, the job still forms and verifies", "[etcd]") {
  EtcdCluster etcd(3);
  TempFolder folder("gradsync-etcd-demo-XXXXXX");
  ChildProcess run({GRADSYNC_DEMO_BINARY, "--clients", "1", "--model", "tiny", "--steps", "3", "--nodes", "16",
                    "--rendezvous", "etcd://" + etcd.endpoints()},
                   folder.path() + "/demo.out");
  // Formation has begun once the first node's record is in etcd.
  const auto start = Clock::now();
  while (keys(etcd).find("/node/") == std::string::npos && Clock::now() - start < 60s) {
    std::this_thread::sleep_for(20ms);
  }
  const std::string before = keys(etcd);
  INFO(before);
  REQUIRE(before.find("/node/") != std::string::npos);
  etcd.kill(0);  // the first member, which every node talks to first
  const int status = run.wait_for(std::chrono::seconds(180));
  std::ifstream out(folder.path() + "/demo.out");
  std::stringstream text;
  text << out.rdbuf();
  INFO(text.str());
  REQUIRE(exited_ok(status));
  CHECK_THAT(text.str(), Catch::Contains("verified: 16 node(s)"));
}

TEST_CASE("etcd formation: TLS and an etcd user through --etcd-* flags, and a member outside --etcd-endpoints "
          "is refused, named",
          "[etcd]") {
  TempFolder certs("gradsync-etcd-certs-XXXXXX");
  make_certificates(certs.path(), {{"etcd", "etcd", "subjectAltName=IP:127.0.0.1"}});
  const EtcdCluster::Tls tls{certs.path() + "/ca.crt", certs.path() + "/etcd.crt", certs.path() + "/etcd.key"};
  EtcdCluster etcd(3, &tls);
  etcd.enable_auth("trainer-nodes", "node-password", "/gradsync/");
  const std::string password = certs.path() + "/password";
  std::ofstream(password) << "node-password\n";
  REQUIRE(::chmod(password.c_str(), 0600) == 0);
  const std::string flags = " --daemon-arg=--etcd-endpoints=" + etcd.endpoints() + " --daemon-arg=--etcd-tls-ca=" +
                            tls.ca + " --daemon-arg=--etcd-user=trainer-nodes --daemon-arg=--etcd-password-file=" +
                            password;
  // "etcd://" alone: the members the daemons were given.
  const DemoRun formed = demo("--nodes 3 --rendezvous etcd://" + flags);
  INFO(formed.run.output);
  REQUIRE(formed.run.code == 0);
  CHECK_THAT(formed.run.output, Catch::Contains("verified: 3 node(s)"));

  const std::string stranger = "127.0.0.1:" + std::to_string(free_loopback_port());
  const DemoRun refused = demo("--nodes 2 --rendezvous etcd://" + stranger + flags);
  INFO(refused.run.output);
  CHECK(refused.run.code != 0);
  CHECK_THAT(refused.run.output, Catch::Contains("rendezvous names etcd member " + stranger +
                                                 ", which is not one of this gradsyncd's --etcd-endpoints"));
}

TEST_CASE("etcd formation: a daemon killed while its job forms: its keys go within its lease's TTL", "[etcd]") {
  EtcdCluster etcd(1);
  ClusterToken token;
  TestDaemon daemon({"--peer-listen", "127.0.0.1:0", "--peer-token-file", token.path(), "--etcd-lease-ttl-s", "2"});
  const std::string job = unique_job("etcd-killed");
  // Node 0 of a 2-node job whose node 1 never comes: its first set's registration forms the
  // job, so it publishes its record and waits.
  ClientGroup trainer(1, [&](int) {
    try {
      auto client = join_nodes(daemon.socket(), job, 0, 2, 1, "etcd://" + etcd.member(0));
      const std::vector<SharedTensor> tensors = {client->allocate(TensorSpec{DType::kFloat32, 16, "dp"})};
      client->register_tensors(tensors, RegisterOptions{});
    } catch (const Error&) {
    }
    return kOk;
  });
  const auto start = Clock::now();
  while (keys(etcd).find("/g0/node/0") == std::string::npos && Clock::now() - start < 20s) {
    std::this_thread::sleep_for(20ms);
  }
  INFO(keys(etcd));
  REQUIRE(keys(etcd).find("/g0/node/0") != std::string::npos);
  daemon.process().signal(SIGKILL);
  const auto killed = Clock::now();
  while (keys(etcd).find("/g0/node/0") != std::string::npos && Clock::now() - killed < 10s) {
    std::this_thread::sleep_for(100ms);
  }
  const auto gone_after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  std::printf("etcd formation: a killed daemon's record was gone %lld ms after the kill (lease TTL 2 s)\n",
              static_cast<long long>(gone_after.count()));
  CHECK(keys(etcd).find("/g0/node/0") == std::string::npos);
  CHECK(gone_after <= 3500ms);
  CHECK(keys(etcd).find("/incarnations") != std::string::npos);  // the job's counter outlives it
}

}  // namespace gradsync::test
