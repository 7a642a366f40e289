// The etcd rendezvous store (daemon/rendezvous/etcd_store.h) against real etcd members on
// loopback: what a get waits for and how it times out, counters, cancellation, the node lease
// (kept alive while the session lives, gone within its TTL after), a killed member, and TLS with
// etcd users.
#include "daemon/rendezvous/etcd_store.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/users.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::shared_ptr<const EtcdAccess> access(const EtcdSettings& settings = {}) {
  std::shared_ptr<const EtcdAccess> loaded;
  const Status status = EtcdAccess::load(settings, std::chrono::hours(1), &loaded);
  INFO(status.to_string());
  REQUIRE(status.ok());
  return loaded;
}

std::shared_ptr<EtcdSession> session(std::shared_ptr<const EtcdAccess> a, std::vector<std::string> members) {
  return std::make_shared<EtcdSession>(std::move(a), std::move(members), Logger(LogLevel::kError));
}

// Whether `key` of job "0.job" is in etcd now, read by a store of its own.
bool present(const EtcdCluster& etcd, const std::string& key) {
  EtcdStore reader(session(access(), {etcd.member(0)}));
  std::vector<std::optional<std::string>> values;
  REQUIRE(reader.peek("0.job", {key}, 2s, &values).ok());
  return values[0].has_value();
}

// The scene of the member-failure tests: a node's store on all three members (2 s lease),
// holding g0/node/0 and waiting up to `wait` for g0/node/1, which another node will set.
struct WaitingNode {
  WaitingNode(const EtcdCluster& etcd, std::chrono::seconds wait)
      : store(session(access(lease_of_two_seconds()), {etcd.member(0), etcd.member(1), etcd.member(2)})) {
    REQUIRE(store.set("0.job", "g0/node/0", "mine", 2s).ok());
    waiting = std::async(std::launch::async, [this, wait] { return store.get("0.job", {"g0/node/1"}, wait, &values); });
    std::this_thread::sleep_for(300ms);  // the get is waiting on member 0
  }
  static EtcdSettings lease_of_two_seconds() {
    EtcdSettings settings;
    settings.lease_ttl = 2s;
    return settings;
  }
  EtcdStore store;
  std::vector<std::string> values;
  std::future<Status> waiting;
};

}  // namespace

TEST_CASE("etcd store: a get waits for its keys by a watch, a timeout names them, counters count, a prefix goes, "
          "cancel ends a wait at once",
          "[etcd]") {
  EtcdCluster etcd(1);
  EtcdStore one(session(access(), {etcd.member(0)}));
  EtcdStore two(session(access(), {etcd.member(0)}));
  REQUIRE(one.set("0.job", "g0/a", "alpha", 2s).ok());
  std::vector<std::string> values;
  REQUIRE(two.get("0.job", {"g0/a"}, 2s, &values).ok());
  CHECK(values == std::vector<std::string>{"alpha"});

  // A key that comes later: the get waits for it (a watch from the revision it read at).
  const auto start = Clock::now();
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);
    return one.set("0.job", "g0/b", std::string("be\0ta", 5), 2s);
  });
  REQUIRE(two.get("0.job", {"g0/a", "g0/b", "g0/a"}, 10s, &values).ok());
  CHECK(Clock::now() - start >= 250ms);
  CHECK(values == std::vector<std::string>{"alpha", std::string("be\0ta", 5), "alpha"});
  REQUIRE(later.get().ok());

  // Keys that never come: a timeout that names how many and the first.
  Status late = two.get("0.job", {"g0/a", "g0/c", "g0/d"}, 300ms, &values);
  CHECK(late.code() == ErrorCode::kTimeout);
  CHECK_THAT(late.message(), Catch::Contains("2 of 3 keys did not appear within 300 ms (the first: g0/c)"));
  CHECK(two.get("0.job", {"g0/c"}, 0ms, &values).code() == ErrorCode::kTimeout);
  std::vector<std::optional<std::string>> peeked;
  REQUIRE(two.peek("0.job", {"g0/a", "g0/c"}, 1s, &peeked).ok());
  CHECK(peeked == std::vector<std::optional<std::string>>{"alpha", std::nullopt});

  bool stored = false;
  REQUIRE(one.set_if_absent("0.job", "g0/once", "first", 2s, &stored).ok());
  CHECK(stored);
  REQUIRE(two.set_if_absent("0.job", "g0/once", "second", 2s, &stored).ok());
  CHECK_FALSE(stored);
  REQUIRE(one.get("0.job", {"g0/once"}, 0ms, &values).ok());
  CHECK(values[0] == "first");

  // A counter is its key's version: each add of 1 is one put, from any store.
  int64_t count = 0;
  REQUIRE(one.add("0.job", "incarnations", 1, 2s, &count).ok());
  CHECK(count == 1);
  REQUIRE(two.add("0.job", "incarnations", 1, 2s, &count).ok());
  CHECK(count == 2);
  REQUIRE(one.add("0.job", "incarnations", 0, 2s, &count).ok());
  CHECK(count == 2);
  REQUIRE(one.add("0.job", "g0/ended", 0, 2s, &count).ok());
  CHECK(count == 0);
  // An increment made again (its answer lost, resent to another member, or committing late
  // through a member that was frozen) counts once, and says the count it made each time.
  REQUIRE(one.count_once("0.job", "g0/cfg/count", "n1", 2s, &count).ok());
  CHECK(count == 1);
  REQUIRE(two.count_once("0.job", "g0/cfg/count", "n2", 2s, &count).ok());
  CHECK(count == 2);
  REQUIRE(one.count_once("0.job", "g0/cfg/count", "n1", 2s, &count).ok());
  CHECK(count == 1);
  REQUIRE(two.count_once("0.job", "g0/cfg/count", "n1", 2s, &count).ok());
  CHECK(count == 1);
  REQUIRE(one.add("0.job", "g0/cfg/count", 0, 2s, &count).ok());
  CHECK(count == 2);
  REQUIRE(one.add("0.job", "g0/cfg/count", 1, 2s, &count).ok());
  CHECK(count == 3);
  const Status by_two = one.add("0.job", "incarnations", 2, 2s, &count);
  CHECK(by_two.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(by_two.message(), Catch::Contains("counts by 0 or 1, not 2"));

  // A generation's keys go by prefix; the job's counter, outside it, stays.
  REQUIRE(one.delete_job("0.job", 2s, "g0/").ok());
  CHECK_FALSE(present(etcd, "g0/a"));
  CHECK_FALSE(present(etcd, "g0/once"));
  REQUIRE(one.add("0.job", "incarnations", 0, 2s, &count).ok());
  CHECK(count == 2);

  // cancel() ends a get that waits, with its reason, and every later call; a fresh handle on
  // the same session is not cancelled.
  auto waiting = std::async(std::launch::async, [&] { return one.get("0.job", {"g0/never"}, 30s, &values); });
  std::this_thread::sleep_for(200ms);
  const auto cancelled_at = Clock::now();
  one.cancel(Status::aborted("job 0.job failed: node 1 is gone"));
  const Status ended = waiting.get();
  CHECK(Clock::now() - cancelled_at < 1s);
  CHECK(ended.code() == ErrorCode::kAborted);
  CHECK_THAT(ended.message(), Catch::Contains("node 1 is gone"));
  CHECK(one.set("0.job", "g0/after", "x", 2s).code() == ErrorCode::kAborted);
  REQUIRE(one.fresh()->set("0.job", "g0/after", "x", 2s).ok());
  CHECK(present(etcd, "g0/after"));
}

TEST_CASE("etcd store: a node's keys live while its session does, and go within the lease TTL after, while counters "
          "and notices stay",
          "[etcd]") {
  EtcdCluster etcd(1);
  EtcdSettings settings;
  settings.lease_ttl = 2s;
  {
    EtcdStore node(session(access(settings), {etcd.member(0)}));
    REQUIRE(node.set("0.job", "g0/node/0", "record", 2s).ok());
    int64_t count = 0;
    REQUIRE(node.add("0.job", "incarnations", 1, 2s, &count).ok());
    // Three TTLs: only the keep-alive keeps the key.
    std::this_thread::sleep_for(6s);
    CHECK(present(etcd, "g0/node/0"));
    // Every lease revoked (as when one ran out while etcd was unreachable): the next writes take
    // new ones, which are renewed in turn.
    const CommandRun leases = etcd.ctl("lease list");
    std::istringstream ids(leases.output);
    int revoked = 0;
    for (std::string word; ids >> word;) {
      if (word.find_first_not_of("0123456789abcdef") == std::string::npos && word.size() > 8) {
        REQUIRE(etcd.ctl("lease revoke " + word).code == 0);
        ++revoked;
      }
    }
    INFO(leases.output);
    REQUIRE(revoked == 2);  // the node's and the job's
    CHECK_FALSE(present(etcd, "g0/node/0"));
    REQUIRE(node.set("0.job", "g0/node/0", "record again", 2s).ok());
    REQUIRE(node.add("0.job", "incarnations", 1, 2s, &count).ok());
    CHECK(count == 1);  // the counter went with its lease
    REQUIRE(node.publish("0.job", "g0/failure/0", "node 0 failed: its trainer was killed", 2s).ok());
    std::this_thread::sleep_for(6s);
    CHECK(present(etcd, "g0/node/0"));
  }
  // The session is gone, as with a daemon that died: the key goes within a TTL (and a second
  // of etcd's lease checking).
  const auto ended = Clock::now();
  while (present(etcd, "g0/node/0") && Clock::now() - ended < 10s) std::this_thread::sleep_for(100ms);
  const auto gone_after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - ended);
  INFO("gone after " << gone_after.count() << " ms");
  CHECK_FALSE(present(etcd, "g0/node/0"));
  CHECK(gone_after <= 3500ms);
  // What others read after the node gave up lives on the job's lease.
  CHECK(present(etcd, "incarnations"));
  CHECK(present(etcd, "g0/failure/0"));
}

TEST_CASE("etcd store: a killed member: calls, a waiting get and the lease's keep-alive move to the next member",
          "[etcd]") {
  EtcdCluster etcd(3);
  WaitingNode node(etcd, 20s);
  EtcdStore& store = node.store;
  etcd.kill(0);  // the member every call went to
  EtcdStore other(session(access(), {etcd.member(1), etcd.member(2)}));
  REQUIRE(other.set("0.job", "g0/node/1", "theirs", 5s).ok());
  const Status waited = node.waiting.get();
  INFO(waited.to_string());
  REQUIRE(waited.ok());
  CHECK(node.values == std::vector<std::string>{"theirs"});
  REQUIRE(store.set("0.job", "g0/after", "x", 5s).ok());
  int64_t count = 0;
  REQUIRE(store.add("0.job", "incarnations", 1, 5s, &count).ok());
  CHECK(count == 1);
  // Three TTLs after the kill, the node's first key is still there: its lease was kept alive
  // through another member.
  std::this_thread::sleep_for(6s);
  std::vector<std::optional<std::string>> peeked;
  REQUIRE(other.peek("0.job", {"g0/node/0"}, 2s, &peeked).ok());
  CHECK(peeked[0] == std::optional<std::string>("mine"));
}

TEST_CASE("etcd store: a frozen member (SIGSTOP): writes, a waiting get and the lease's renewals move to the next "
          "member",
          "[etcd]") {
  EtcdCluster etcd(3);
  WaitingNode node(etcd, 30s);
  EtcdStore& store = node.store;
  etcd.freeze(0);  // connected, answering nothing: its watch and renewals stall
  EtcdStore other(session(access(), {etcd.member(1), etcd.member(2)}));
  REQUIRE(other.set("0.job", "g0/node/1", "theirs", 5s).ok());
  const auto set_at = Clock::now();
  REQUIRE(store.set("0.job", "g0/after", "x", 10s).ok());  // an attempt's bound, then the next member
  const Status waited = node.waiting.get();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - set_at);
  INFO(waited.to_string() << " after " << took.count() << " ms");
  REQUIRE(waited.ok());
  CHECK(node.values == std::vector<std::string>{"theirs"});
  CHECK(took < 20s);  // the watch's channel pings the member every 10 s, 3 s for an answer
  // Three TTLs frozen: the node's key lives, renewed through another member.
  std::this_thread::sleep_for(6s);
  std::vector<std::optional<std::string>> peeked;
  REQUIRE(other.peek("0.job", {"g0/node/0"}, 2s, &peeked).ok());
  CHECK(peeked[0] == std::optional<std::string>("mine"));
  etcd.thaw(0);
}

TEST_CASE("etcd store: TLS and an etcd user with JWT tokens: the right password works past a dead first member and "
          "a change of etcd's users, and a wrong one, no CA and a prefix outside the user's role are refused, named",
          "[etcd]") {
  TempFolder certs("gradsync-etcd-certs-XXXXXX");
  make_certificates(certs.path(), {{"etcd", "etcd", "subjectAltName=IP:127.0.0.1"}});
  const CommandRun jwt_keys = run_command("cd " + certs.path() + " && openssl genrsa -out jwt.key 2048 && "
                                          "openssl rsa -in jwt.key -pubout -out jwt.pub");
  INFO(jwt_keys.output);
  REQUIRE(jwt_keys.code == 0);
  const EtcdCluster::Tls tls{certs.path() + "/ca.crt", certs.path() + "/etcd.crt", certs.path() + "/etcd.key"};
  // JWT tokens name the revision of etcd's users when they were made: after a change, etcd
  // refuses them with "revision of auth store is old".
  EtcdCluster etcd(3, &tls,
                   {"--auth-token", "jwt,pub-key=" + certs.path() + "/jwt.pub,priv-key=" + certs.path() +
                                        "/jwt.key,sign-method=RS256,ttl=10m"});
  etcd.enable_auth("trainer-nodes", "right-password", "/gradsync/");
  const auto password_file = [&](const std::string& name, const std::string& password) {
    const std::string path = certs.path() + "/" + name;
    std::ofstream(path) << password << "\n";
    REQUIRE(::chmod(path.c_str(), 0600) == 0);
    return path;
  };
  EtcdSettings settings;
  settings.endpoints = {etcd.member(0), etcd.member(1), etcd.member(2)};
  settings.tls_ca = tls.ca;
  settings.user = "trainer-nodes";
  settings.password_file = password_file("right", "right-password");
  {
    EtcdStore store(session(access(settings), settings.endpoints));
    REQUIRE(store.set("0.job", "g0/node/0", "over TLS", 5s).ok());
    // Another user added: the tokens made before are refused as old, and made anew.
    REQUIRE(etcd.ctl("user add someone-else:other --interactive=false", EtcdCluster::kRoot).code == 0);
    REQUIRE(store.set("0.job", "g0/node/0", "over TLS", 5s).ok());
    std::vector<std::string> values;
    auto later = std::async(std::launch::async, [&] {
      std::this_thread::sleep_for(200ms);
      return EtcdStore(session(access(settings), settings.endpoints)).set("0.job", "g0/node/1", "too", 5s);
    });
    REQUIRE(store.get("0.job", {"g0/node/0", "g0/node/1"}, 10s, &values).ok());
    CHECK(values == std::vector<std::string>{"over TLS", "too"});
    REQUIRE(later.get().ok());
  }
  {
    EtcdSettings wrong = settings;
    wrong.password_file = password_file("wrong", "wrong-password");
    const Status refused = EtcdStore(session(access(wrong), {etcd.member(0)})).set("0.job", "g0/x", "x", 5s);
    INFO(refused.to_string());
    CHECK_FALSE(refused.ok());
    CHECK_THAT(refused.message(), Catch::Contains("authenticating as etcd user 'trainer-nodes'"));
    CHECK_THAT(refused.message(), Catch::Contains("authentication failed"));
  }
  {
    EtcdSettings plain = settings;
    plain.tls_ca.clear();
    plain.user.clear();
    plain.password_file.clear();
    const Status refused = EtcdStore(session(access(plain), {etcd.member(0)})).set("0.job", "g0/x", "x", 2s);
    INFO(refused.to_string());
    CHECK_FALSE(refused.ok());
    CHECK_THAT(refused.message(), Catch::Contains(etcd.member(0)));
  }
  {
    // The first member dead before the first call: the authentication moves on with the call.
    etcd.kill(0);
    EtcdStore store(session(access(settings), settings.endpoints));
    const Status written = store.set("0.job", "g0/node/2", "past a dead member", 10s);
    INFO(written.to_string());
    CHECK(written.ok());
  }
  {
    EtcdSettings elsewhere = settings;
    elsewhere.prefix = "/not-gradsync/";
    const Status refused = EtcdStore(session(access(elsewhere), {etcd.member(1)})).set("0.job", "g0/x", "x", 5s);
    INFO(refused.to_string());
    CHECK(refused.code() == ErrorCode::kPermissionDenied);
    CHECK_THAT(refused.message(), Catch::Contains("permission denied"));
  }
}

}  // namespace gradsync::test
