// The peer service's authentication, against real gradsyncd processes: a cluster token checked
// on every call, mutual TLS with the cluster's CA, and without either a service that listens on
// loopback only and refuses multi-node jobs, saying how to configure one.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/peer/peer_client.h"
#include "tests/integration/harness.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;

constexpr auto kShort = 5000ms;

// `node`: the member its proofs name (kv_store.h); empty: none.
std::shared_ptr<const PeerAuth> token_auth(const std::string& token, const std::string& node = {}) {
  auto auth = std::make_shared<PeerAuth>();
  auth->token = token;
  auth->node = node;
  return auth;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::shared_ptr<const PeerAuth> tls_auth(const std::string& dir, const std::string& who, const std::string& ca = "ca") {
  auto auth = std::make_shared<PeerAuth>();
  auth->tls_cert = read_file(dir + "/" + who + ".crt");
  auth->tls_key = read_file(dir + "/" + who + ".key");
  auth->tls_ca = read_file(dir + "/" + ca + ".crt");
  return auth;
}

// One verified allreduce across `nodes` daemons, two ranks each.
void verified_job(TestCluster& cluster, int nodes) {
  const int world = 2 * nodes;
  const std::string job = unique_job("auth-job");
  ClientGroup group(world, [&](int rank) {
    auto client = join_nodes(cluster.node(rank / 2).socket(), job, rank, world, 2, cluster.rendezvous());
    const TensorSet set =
        client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 1024, "dp"}}), {});
    const auto values = set.tensor(0).as<float>();
    for (auto& v : values) v = static_cast<float>(rank + 1);
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(20s)) return fail("step timed out");
    for (float v : values) {
      if (v != static_cast<float>(world * (world + 1) / 2)) return fail("wrong sum");
    }
    return kOk;
  });
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

}  // namespace

TEST_CASE("peer auth: with a cluster token, calls without a proof of it or with another's are refused, the job "
          "verifies",
          "[integration][peer][auth]") {
  TestCluster cluster(3);  // the harness gives every node the same --peer-token-file
  const std::string rendezvous = cluster.rendezvous();
  const Status none = PeerClient(rendezvous).set("0.x", "node/0", "forged", kShort);
  CHECK(none.code() == ErrorCode::kPermissionDenied);
  CHECK_THAT(none.message(), Catch::Contains("carries no proof of the cluster token"));
  const Status wrong = PeerClient(rendezvous, token_auth("0123456789abcdef0123456789abcdef")).ping(kShort);
  CHECK(wrong.code() == ErrorCode::kPermissionDenied);
  CHECK_THAT(wrong.message(), Catch::Contains("does not match this node's cluster token"));
  std::vector<std::string> values;
  CHECK(PeerClient(rendezvous).get("0.x", {"k"}, 0ms, &values).code() == ErrorCode::kPermissionDenied);
  verified_job(cluster, 3);
}

TEST_CASE("peer auth: with mutual TLS, a peer without a certificate of the cluster's CA is refused, the job verifies",
          "[integration][peer][auth]") {
  char pattern[] = "/tmp/gradsync-peer-tls-XXXXXX";
  REQUIRE(::mkdtemp(pattern));
  const std::string d = pattern;
  make_certificates(d, {{"node", "node", "subjectAltName=IP:127.0.0.1"},
                        {"intruder", "intruder", "subjectAltName=IP:127.0.0.1", "rogue"}});
  TestCluster cluster(2, {"--peer-tls-cert", d + "/node.crt", "--peer-tls-key", d + "/node.key", "--peer-tls-ca",
                          d + "/ca.crt"});
  const std::string rendezvous = cluster.rendezvous();
  // The token the harness adds is right; the certificates are what is tested here.
  auto with_token = [&](std::shared_ptr<const PeerAuth> auth) {
    auto copy = std::make_shared<PeerAuth>(*auth);
    std::ifstream in(cluster.token_path());
    std::getline(in, copy->token);
    return std::shared_ptr<const PeerAuth>(copy);
  };
  CHECK(PeerClient(rendezvous, with_token(tls_auth(d, "node"))).ping(kShort).ok());
  CHECK_FALSE(PeerClient(rendezvous, with_token(tls_auth(d, "intruder", "ca"))).ping(kShort).ok());
  auto plaintext = std::make_shared<PeerAuth>();
  std::ifstream in(cluster.token_path());
  std::getline(in, plaintext->token);
  CHECK_FALSE(PeerClient(rendezvous, plaintext).ping(kShort).ok());  // no TLS at all
  verified_job(cluster, 2);
  std::filesystem::remove_all(d);
}

// The review: with TLS, gRPC accepted peer connections itself, unbounded, and held ones that
// never finished a handshake. Now the daemon accepts them (tcp_listener.h): past 64 from one
// host the oldest silent one makes way for a newcomer, and every silent one is closed once
// the 5 s proof window has passed.
TEST_CASE("peer auth: with mutual TLS the peer port is bounded, silent connections make way and are closed",
          "[integration][peer][auth]") {
  char pattern[] = "/tmp/gradsync-peer-tls-XXXXXX";
  REQUIRE(::mkdtemp(pattern));
  const std::string d = pattern;
  make_certificates(d, {{"node", "node", "subjectAltName=IP:127.0.0.1"}});
  TestCluster cluster(1, {"--peer-tls-cert", d + "/node.crt", "--peer-tls-key", d + "/node.key", "--peer-tls-ca",
                          d + "/ca.crt"});
  const std::string rendezvous = cluster.rendezvous();
  auto node = std::make_shared<PeerAuth>(*tls_auth(d, "node"));
  std::getline(std::ifstream(cluster.token_path()), node->token);
  const int port = std::stoi(rendezvous.substr(rendezvous.rfind(':') + 1));
  std::vector<int> silent;
  for (int i = 0; i < 100; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);
  const auto count_closed = [&] {
    int closed = 0;
    for (int fd : silent) closed += closed_by_other_end(fd);
    return closed;
  };
  const int made_way = count_closed();
  // A node of the cluster still gets in, at once: a silent connection makes way.
  const auto start = std::chrono::steady_clock::now();
  CHECK(PeerClient(rendezvous, node).ping(kShort).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::this_thread::sleep_for(6s);  // past the proof window
  const int closed_by_then = count_closed();
  std::printf("TLS peer port: 100 silent connections, %d closed at once, %d after the proof window; a node's "
              "Ping answered in %.3f s\n",
              made_way, closed_by_then, seconds);
  CHECK(made_way >= 100 - 64);
  CHECK(closed_by_then == 100);
  CHECK(seconds < 2.0);
  CHECK_THAT(cluster.node(0).log(), Catch::Contains("made no authenticated call within 5000 ms"));
  for (int fd : silent) ::close(fd);
  std::filesystem::remove_all(d);
}

TEST_CASE("peer auth: without a token or TLS the peer service stays on loopback and multi-node jobs are refused",
          "[integration][peer][auth]") {
  // The default listen address is loopback then, and another is refused at start.
  const CommandRun wide = run_command(std::string(GRADSYNCD_BINARY) + " --socket /tmp/gradsync-peer-auth-" +
                                      std::to_string(::getpid()) + "/g.sock --peer-listen 0.0.0.0:0 2>&1");
  CHECK(wide.code == 2);
  CHECK_THAT(wide.output, Catch::Contains("the peer service is not authenticated, so it may listen on loopback only") &&
                              Catch::Contains("--peer-token-file"));
  TestDaemon daemon;
  CHECK_THAT(daemon.log(), Catch::Contains("unauthenticated: loopback only"));
  try {
    join_nodes(daemon.socket(), unique_job("no-auth"), 0, 4, 2, "127.0.0.1:1");
    FAIL("a multi-node job was accepted without peer authentication");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("peer service is not authenticated") &&
                             Catch::Contains("--peer-token-file FILE (the same token"));
  }
  // Single-node jobs are unaffected.
  auto client = join(daemon.socket(), unique_job("single"), 0, 1);
  CHECK(client != nullptr);
}

TEST_CASE("peer auth: a token file others can read, or a short one, is refused at start", "[integration][peer][auth]") {
  char pattern[] = "/tmp/gradsync-token-test-XXXXXX";
  REQUIRE(::mkdtemp(pattern));
  const std::string d = pattern;
  const auto start = [&](const std::string& token) {
    return run_command(std::string(GRADSYNCD_BINARY) + " --socket " + d + "/s/g.sock --peer-listen 127.0.0.1:0" +
                       " --peer-token-file " + token + " 2>&1");
  };
  std::ofstream(d + "/readable") << "0123456789abcdef0123456789abcdef\n";
  REQUIRE(::chmod((d + "/readable").c_str(), 0644) == 0);
  CommandRun run = start(d + "/readable");
  CHECK(run.code != 0);
  CHECK_THAT(run.output, Catch::Contains("can be read by other users (chmod 600 it)"));
  std::ofstream(d + "/short") << "tiny\n";
  REQUIRE(::chmod((d + "/short").c_str(), 0600) == 0);
  run = start(d + "/short");
  CHECK(run.code != 0);
  CHECK_THAT(run.output, Catch::Contains("fewer than 16 bytes; make one with: openssl rand -hex 32"));
  std::filesystem::remove_all(d);
}

}  // namespace gradsync::test

namespace gradsync::test {
namespace {

std::string status_json(TestDaemon& daemon) { return gradsyncctl(daemon, "status --json").output; }

}  // namespace

TEST_CASE("peer store bounds: a flood of values is refused at the job's limit and its memory comes back, a cancelled "
          "get is freed at once",
          "[integration][peer][auth]") {
  ClusterToken token;
  const int port = free_loopback_port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  TestDaemon daemon({"--peer-listen", address, "--peer-token-file", token.path()});
  std::string secret;
  std::getline(std::ifstream(token.path()), secret);
  auto auth = token_auth(secret);
  PeerClient client(address, auth);
  REQUIRE(client.ping(kShort).ok());
  const long baseline = rss_kib(daemon.pid());
  // 1 MiB values into one job, from three members in turn, until the store refuses: at its 64
  // MiB per job (each member holds about 21 MiB then, under its 32 MiB).
  const std::string value(1 << 20, 'v');
  Status refused;
  int stored = 0;
  int64_t counter = 0;
  for (const char* job : {"0.flood", "0.other", "0.wait"}) REQUIRE(client.add(job, "incarnations", 1, kShort, &counter).ok());
  std::vector<std::unique_ptr<PeerClient>> members;
  for (int m = 0; m < 3; ++m) {
    members.push_back(std::make_unique<PeerClient>(address, token_auth(secret, "member-" + std::to_string(m))));
    // A node of the job may write its keys.
    REQUIRE(members.back()->set("0.flood", "g0/node/" + std::to_string(m), "x", kShort).ok());
  }
  for (; stored < 200; ++stored) {
    refused = members[static_cast<size_t>(stored % 3)]->set("0.flood", "g0/group/dp/k" + std::to_string(stored),
                                                            value, kShort);
    if (!refused.ok()) break;
  }
  INFO(refused.to_string());
  CHECK(refused.code() == ErrorCode::kResourceExhausted);
  CHECK_THAT(refused.message(), Catch::Contains("its limit per job"));
  CHECK(stored >= 60);
  CHECK(stored < 64);
  // One member alone stops at its own 32 MiB, in a job of its own.
  REQUIRE(client.add("0.alone", "incarnations", 1, kShort, &counter).ok());
  PeerClient alone(address, token_auth(secret, "member-alone"));
  REQUIRE(alone.set("0.alone", "g0/node/0", "x", kShort).ok());
  int alone_stored = 0;
  Status alone_refused;
  for (; alone_stored < 100; ++alone_stored) {
    alone_refused = alone.set("0.alone", "g0/group/dp/k" + std::to_string(alone_stored), value, kShort);
    if (!alone_refused.ok()) break;
  }
  INFO(alone_refused.to_string());
  CHECK(alone_refused.code() == ErrorCode::kResourceExhausted);
  CHECK_THAT(alone_refused.message(), Catch::Contains("node member-alone") &&
                                          Catch::Contains("its limit per member"));
  CHECK(alone_stored >= 28);
  CHECK(alone_stored < 32);
  REQUIRE(alone.add("0.alone", "g0/ended", 1, kShort, &counter).ok());
  REQUIRE(alone.delete_job("0.alone", kShort, "g0/").ok());
  const long flooded = rss_kib(daemon.pid());
  CHECK(flooded - baseline > 50 * 1024);
  // Another job is unaffected.
  REQUIRE(client.set("0.other", "g0/node/0", "v", kShort).ok());
  for (auto& member : members) REQUIRE(member->add("0.flood", "g0/ended", 1, kShort, &counter).ok());
  REQUIRE(members[0]->delete_job("0.flood", kShort, "g0/").ok());
  const long after = rss_kib(daemon.pid());
  INFO("RSS KiB: baseline " << baseline << ", flooded " << flooded << ", after delete " << after);
  CHECK(after - baseline < 8 * 1024);
  // A get parked for a minute whose caller gives up is freed now, not at its deadline.
  auto waiting = std::make_shared<PeerClient>(address, auth);
  REQUIRE(waiting->set("0.wait", "g0/node/0", "x", kShort).ok());
  std::thread parked([waiting] {
    std::vector<std::string> values;
    waiting->get("0.wait", {"g0/never"}, std::chrono::minutes(1), &values);
  });
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    seen = status_json(daemon).find("\"peerStoreWaitingGets\": 1") != std::string::npos;
    if (!seen) std::this_thread::sleep_for(20ms);
  }
  CHECK(seen);
  waiting->cancel(Status::aborted("test gives up"));
  parked.join();
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    freed = status_json(daemon).find("\"peerStoreWaitingGets\": 0") != std::string::npos;
    if (!freed) std::this_thread::sleep_for(20ms);
  }
  CHECK(freed);
  CHECK(daemon.running());
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("peer store: a generation's keys go when every node ended the job, a job nobody touches expires",
          "[integration][peer][auth]") {
  TestCluster cluster(2);
  verified_job(cluster, 2);
  std::string secret;
  std::getline(std::ifstream(cluster.token_path()), secret);
  PeerClient rendezvous(cluster.rendezvous(), token_auth(secret));
  // The jobs end on both nodes once their trainers left: the last one deletes the keys.
  bool gone = false;
  std::string last;
  for (int i = 0; i < 200 && !gone; ++i) {
    last = gradsyncctl(cluster.node(0), "status --json").output;
    // Only the job's incarnation counter is left (a few dozen bytes), not its node table,
    // layouts and Gloo addresses (kilobytes).
    const auto at = last.find("\"peerStoreBytes\": ");
    gone = at != std::string::npos && std::stoul(last.substr(at + 18)) < 200;
    if (!gone) std::this_thread::sleep_for(25ms);
  }
  INFO(last);
  CHECK(gone);

  // A job whose nodes never say they ended (killed) is forgotten after --peer-key-ttl-s.
  ClusterToken token;
  const std::string address = "127.0.0.1:" + std::to_string(free_loopback_port());
  TestDaemon daemon({"--peer-listen", address, "--peer-token-file", token.path(), "--peer-key-ttl-s", "1"});
  std::getline(std::ifstream(token.path()), secret);
  PeerClient abandoning(address, token_auth(secret));
  int64_t counter = 0;
  REQUIRE(abandoning.add("0.abandoned", "incarnations", 1, kShort, &counter).ok());
  REQUIRE(abandoning.set("0.abandoned", "g0/node/0", "x", kShort).ok());
  CHECK_THAT(gradsyncctl(daemon, "status --json").output, Catch::Contains("\"peerStoreJobs\": 1"));
  bool expired = false;
  for (int i = 0; i < 200 && !expired; ++i) {
    expired = gradsyncctl(daemon, "status --json").output.find("\"peerStoreJobs\": 0") != std::string::npos;
    if (!expired) std::this_thread::sleep_for(25ms);
  }
  CHECK(expired);
}

TEST_CASE("peer auth: names that only look like loopback, and tokens gRPC cannot carry, are refused at start",
          "[integration][peer][auth]") {
  const std::string socket = " --socket /tmp/gradsync-peer-names-" + std::to_string(::getpid()) + "/g.sock";
  for (const std::string listen : {"127.0.0.1.nip.io:0", "127.evil.example:0", "0.0.0.0:0", "[::]:0"}) {
    const CommandRun run = run_command(std::string(GRADSYNCD_BINARY) + socket + " --peer-listen " + listen + " 2>&1");
    INFO(listen << ": " << run.output);
    CHECK(run.code == 2);
    CHECK_THAT(run.output, Catch::Contains("may listen on loopback only"));
  }
  char pattern[] = "/tmp/gradsync-token-bytes-XXXXXX";
  const int fd = ::mkstemp(pattern);
  const std::string token = "tab\there-and-0123456789abcdef";
  REQUIRE(::write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size()));
  ::close(fd);
  const CommandRun run = run_command(std::string(GRADSYNCD_BINARY) + socket + " --peer-listen 127.0.0.1:0" +
                                     " --peer-token-file " + pattern + " 2>&1");
  CHECK(run.code != 0);
  CHECK_THAT(run.output, Catch::Contains("must hold one word of printable ASCII"));
  ::unlink(pattern);
}

}  // namespace gradsync::test

namespace gradsync::test {

TEST_CASE("peer keys: a daemon with the cluster token but not in the job cannot alter, read or delete its keys, the "
          "job verifies throughout",
          "[integration][peer][auth]") {
  TestCluster cluster(3);  // node 2 takes no part in the job
  std::string secret;
  std::getline(std::ifstream(cluster.token_path()), secret);
  const std::string job = unique_job("scoped");
  constexpr int kWorld = 4;
  Latch stepped;
  std::vector<std::unique_ptr<Latch>> attacked;  // one per rank: a latch wakes one waiter
  for (int r = 0; r < kWorld; ++r) attacked.push_back(std::make_unique<Latch>());
  ClientGroup group(kWorld, [&](int rank) {
    auto client = join_nodes(cluster.node(rank / 2).socket(), job, rank, kWorld, 2, cluster.rendezvous());
    const TensorSet set =
        client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 1024, "dp"}}), {});
    const auto values = set.tensor(0).as<float>();
    for (int step = 0; step < 2; ++step) {
      for (auto& v : values) v = static_cast<float>(rank + 1 + step);
      if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(20s)) return fail("step timed out");
      const float want = static_cast<float>(kWorld * (kWorld + 1) / 2 + kWorld * step);
      for (float v : values) {
        if (v != want) return fail("wrong sum at step " + std::to_string(step));
      }
      if (step == 0) {
        if (rank == 0) stepped.open();
        if (!attacked[static_cast<size_t>(rank)]->wait(30s)) return fail("the test never finished its attempts");
      }
    }
    return kOk;
  });
  REQUIRE(stepped.wait(60s));
  // Another member of the cluster: the token, but its own instance, as a daemon of another job.
  PeerClient stranger(cluster.rendezvous(), token_auth(secret));
  const std::string store = std::to_string(::getuid()) + "." + job;
  const auto denied = [](const Status& status, const std::string& text) {
    INFO(status.to_string());
    CHECK(status.code() == ErrorCode::kPermissionDenied);
    CHECK_THAT(status.message(), Catch::Contains(text));
  };
  denied(stranger.set(store, "g0/node/1", "1 127.0.0.1:1", kShort), "was already taken by another daemon");
  // No other place either: the rendezvous (node 0's daemon) runs the job and knows its shape.
  denied(stranger.set(store, "g0/node/0", "1 127.0.0.1:1", kShort), "is the rendezvous daemon's own");
  denied(stranger.set(store, "g0/node/2", "1 127.0.0.1:1", kShort), "the job has 2 nodes");
  denied(stranger.set(store, "g1/node/1", "1 127.0.0.1:1", kShort), "that generation has not begun");
  denied(stranger.set(store, "g9/node/1", "1 127.0.0.1:1", kShort), "that generation has not begun");
  denied(stranger.set(store, "g0/node/01", "1 127.0.0.1:1", kShort), "holds no node of g0");
  denied(stranger.set(store, "g0/node/-1", "1 127.0.0.1:1", kShort), "holds no node of g0");
  denied(stranger.set(store, "g0/set/1/layout/0", "forged", kShort), "holds no node of g0");
  denied(stranger.set(store, "g0/group/dp/0", "forged", kShort), "holds no node of g0");
  denied(stranger.set(store, "incarnations", "9", kShort), "not one the formation protocol sets");
  int64_t value = 0;
  const Status poisoned = stranger.add(store, "incarnations", 1000, kShort, &value);
  CHECK(poisoned.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(poisoned.message(), Catch::Contains("counters move by 0 or 1"));
  denied(stranger.add(store, "g0/ended", 1, kShort, &value), "holds no node of g0");
  denied(stranger.add(store, "g0/anything", 1, kShort, &value), "not a counter of the formation protocol");
  std::vector<std::string> values;
  denied(stranger.get(store, {"g0/node/0"}, 0ms, &values), "holds no node of g0");
  denied(stranger.delete_job(store, kShort, "g0/"), "holds no node of g0");
  denied(stranger.delete_job(store, kShort), "only a generation's");
  // Reserved names are nobody's.
  CHECK(stranger.set(store, "g0/~claim/1", "x", kShort).code() == ErrorCode::kInvalidArgument);
  for (auto& latch : attacked) latch->open();
  for (int s : group.wait_all(60s)) CHECK(exit_code(s) == kOk);
}

namespace {

// Seconds from forking 2 nodes x 2 ranks of a new job to each rank's first allreduce done, and
// whether every rank got there.
std::pair<bool, double> time_formation(TestCluster& cluster) {
  const std::string job = unique_job("formed");
  const auto start = std::chrono::steady_clock::now();
  ClientGroup group(4, [&](int rank) {
    auto client = join_nodes(cluster.node(rank / 2).socket(), job, rank, 4, 2, cluster.rendezvous());
    const TensorSet set =
        client->register_tensors(client->allocate_flat(std::vector<TensorSpec>{{DType::kFloat32, 8, "dp"}}), {});
    return client->allreduce(set, ReduceOptions{}).wait(30s) ? kOk : fail("the first allreduce did not end");
  });
  bool ok = true;
  for (int status : group.wait_all(60s)) ok = ok && exit_code(status) == kOk;
  return {ok, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// The review's store attack: one member filled the 512 MiB store (new multi-node jobs then
// failed at once), and parked 1,000 gets while looping sets (another job's formation went from
// 20 ms to 12 s, as every put scanned every parked get). Now a member is held to its quotas
// (32 MiB, 1,024 parked gets) whatever jobs it spreads over, and a put looks only at the gets
// waiting for its key.
TEST_CASE("peer store: one member filling its quota and parking gets leaves another job's formation within 2x",
          "[integration][peer][auth][serial]") {
  TestCluster cluster(2);
  std::string secret;
  std::getline(std::ifstream(cluster.token_path()), secret);
  std::vector<double> idle, attacked;
  for (int i = 0; i < 5; ++i) {
    const auto [ok, seconds] = time_formation(cluster);
    REQUIRE(ok);
    idle.push_back(seconds);
  }
  // The attacker is a process of its own at nice 19, as if on a node of its own: what is under
  // test is what the store lets it hold, not how two cores share out.
  constexpr int kParked = 1000;
  Latch attacking, over;
  ClientGroup attack(1, [&](int) {
    ::setpriority(PRIO_PROCESS, 0, 19);
    auto attacker = std::make_shared<PeerClient>(cluster.rendezvous(), token_auth(secret, "attacker:1"));
    int64_t counter = 0;
    // Fill: 1 MiB values over as many jobs as it takes (each job's own limit is 64 MiB).
    const std::string value(1 << 20, 'v');
    Status refused;
    int stored = 0;
    for (int job = 0; job < 20 && refused.ok(); ++job) {
      const std::string store = "0.attack-" + std::to_string(job);
      if (!attacker->add(store, "incarnations", 1, kShort, &counter).ok() ||
          !attacker->set(store, "g0/node/0", "x", kShort).ok()) {
        return fail("cannot take a node of " + store);
      }
      for (int k = 0; k < 40 && refused.ok(); ++k) {
        refused = attacker->set(store, "g0/fill/" + std::to_string(k) + "/0", value, kShort);
        stored += refused.ok();
      }
    }
    if (refused.code() != ErrorCode::kResourceExhausted || refused.message().find("its limit per member") == std::string::npos) {
      return fail("the fill ended with: " + refused.to_string());
    }
    // Park gets, each waiting on a key the attacker then keeps setting and on one never set.
    std::vector<std::thread> parked;
    std::atomic<int> refused_gets{0};
    for (int i = 0; i < kParked; ++i) {
      parked.emplace_back([attacker, i, &refused_gets] {
        std::vector<std::string> values;
        const Status s = attacker->get("0.attack-0", {"g0/w" + std::to_string(i) + "/0", "g0/never/" + std::to_string(i) + "/0"},
                                       std::chrono::minutes(2), &values);
        if (s.code() == ErrorCode::kResourceExhausted) ++refused_gets;
      });
    }
    std::atomic<bool> stop{false};
    std::thread sets([&] {
      for (int i = 0; !stop; ++i) {
        (void)attacker->set("0.attack-0", "g0/w" + std::to_string(i % kParked) + "/0", "x", kShort);
        std::this_thread::sleep_for(1ms);
      }
    });
    std::this_thread::sleep_for(2s);  // the gets are parked, the sets going
    std::printf("peer store attack: one member stored %d MiB before its quota (%s), parked %d gets (%d refused), "
                "loops sets\n",
                stored, refused.message().c_str(), kParked, refused_gets.load());
    std::fflush(stdout);
    attacking.open();
    const bool released = over.wait(120s);
    stop = true;
    sets.join();
    attacker->cancel(Status::aborted("the test's attack is over"));
    for (auto& t : parked) t.join();
    return released ? kOk : fail("never released");
  });
  REQUIRE(attacking.wait(120s));
  for (int i = 0; i < 5; ++i) {
    const auto [ok, seconds] = time_formation(cluster);
    CHECK(ok);
    attacked.push_back(seconds);
  }
  over.open();
  CHECK(exit_code(attack.wait(0, 60s)) == kOk);
  const double before = median_of(idle), during = median_of(attacked);
  std::printf("another job's formation (2 nodes x 2 ranks, to the first allreduce): median %.3f s idle, %.3f s "
              "under attack (%.2fx)\n",
              before, during, during / before);
  CHECK(during <= 2 * before);
  CHECK(cluster.node(0).running());
}

}  // namespace gradsync::test
