// The etcd store (daemon/rendezvous/etcd_store.h) against a fake member (fake_etcd.h): answers
// no etcd gives are refused with an error naming the member, never read past their end; a
// watch refused for a stale token logs in again once; a renewal that finds the lease gone has
// the next write grant another. The real members' behaviour is tests/etcd's.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <map>
#include <tuple>
#include <limits>
#include <thread>

#include "client/tools/process.h"
#include "daemon/rendezvous/etcd_store.h"
#include "tests/unit/fake_etcd.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A store on `fake` alone; with `user`, it logs in (with a password from a file of its own).
struct StoreOn {
  explicit StoreOn(const FakeEtcd& fake, const std::string& user = {}, std::chrono::seconds lease_ttl = 10s,
                   std::chrono::seconds counter_ttl = std::chrono::hours(1))
      : folder("gradsync-fake-etcd-XXXXXX") {
    EtcdSettings settings;
    settings.endpoints = {fake.address()};
    settings.lease_ttl = lease_ttl;
    if (!user.empty()) {
      settings.user = user;
      settings.password_file = folder.path() + "/password";
      std::ofstream(settings.password_file) << "a password\n";
      REQUIRE(::chmod(settings.password_file.c_str(), 0600) == 0);
    }
    std::shared_ptr<const EtcdAccess> access;
    const Status loaded = EtcdAccess::load(settings, counter_ttl, &access);
    INFO(loaded.to_string());
    REQUIRE(loaded.ok());
    store = std::make_unique<EtcdStore>(
        std::make_shared<EtcdSession>(access, std::vector<std::string>{fake.address()}, Logger(LogLevel::kError)));
  }
  TempFolder folder;
  std::unique_ptr<EtcdStore> store;
};

// A read transaction answered as etcd answers one that finds none of its keys.
grpc::Status nothing_there(const std::string&, const etcdserverpb::TxnRequest& request,
                           etcdserverpb::TxnResponse* response) {
  response->mutable_header()->set_revision(7);
  response->set_succeeded(true);
  for (int i = 0; i < request.success_size(); ++i) response->add_responses()->mutable_response_range();
  return grpc::Status::OK;
}

// One watch reply carrying puts of `kvs` (key, value).
etcdserverpb::WatchResponse puts(const std::vector<std::pair<std::string, std::string>>& kvs) {
  etcdserverpb::WatchResponse response;
  for (const auto& [key, value] : kvs) {
    auto* event = response.add_events();
    event->set_type(mvccpb::Event::PUT);
    event->mutable_kv()->set_key(key);
    event->mutable_kv()->set_value(value);
  }
  return response;
}

etcdserverpb::WatchResponse compacted(int64_t revision) {
  etcdserverpb::WatchResponse response;
  response.set_compact_revision(revision);
  return response;
}

etcdserverpb::WatchResponse cancelled(const std::string& reason) {
  etcdserverpb::WatchResponse response;
  response.set_canceled(true);
  response.set_cancel_reason(reason);
  return response;
}

// A watch handler that answers every watch with `reply`, then holds it open.
FakeEtcd::WatchHandler answering(etcdserverpb::WatchResponse reply) {
  return [reply](const std::string&, const etcdserverpb::WatchCreateRequest&, FakeEtcd::WatchStream* s) {
    s->Write(reply);
    FakeEtcd::hold(s);
    return grpc::Status::OK;
  };
}

// Job "0.job"'s key `key` as etcd holds it, under the default --etcd-prefix.
std::string full(const std::string& key) { return "/gradsync/0.job/" + key; }

}  // namespace

TEST_CASE("etcd store: answers no etcd gives are refused naming the member, never read past their end",
          "[unit][etcd]") {
  SECTION("a read answered with fewer ranges than it asked for") {
    FakeEtcd fake({.txn = [](const std::string&, const etcdserverpb::TxnRequest&, etcdserverpb::TxnResponse* r) {
      r->set_succeeded(true);
      return grpc::Status::OK;
    }});
    std::vector<std::optional<std::string>> values;
    const Status status = StoreOn(fake).store->peek("0.job", {"a", "b"}, 2s, &values);
    INFO(status.to_string());
    CHECK(status.code() == ErrorCode::kProtocol);
    CHECK_THAT(status.message(), Catch::Contains(fake.address()) && Catch::Contains("answered 0"));
  }
  SECTION("a count answered with no responses, committed or not") {
    const bool committed = GENERATE(true, false);
    FakeEtcd fake({.txn = [committed](const std::string&, const etcdserverpb::TxnRequest&,
                                      etcdserverpb::TxnResponse* r) {
      r->set_succeeded(committed);
      return grpc::Status::OK;
    }});
    int64_t count = -1;
    const Status status = StoreOn(fake).store->add("0.job", "arrived", 1, 2s, &count);
    INFO(status.to_string());
    CHECK(status.code() == ErrorCode::kProtocol);
    CHECK_THAT(status.message(), Catch::Contains(fake.address()) && Catch::Contains("counting arrived"));
    CHECK(count == -1);
  }
  SECTION("a lease granted under another ID than the one asked for") {
    FakeEtcd fake({.grant = [](const std::string&, const etcdserverpb::LeaseGrantRequest& request,
                               etcdserverpb::LeaseGrantResponse* r) {
      r->set_id(request.id() + 2);
      r->set_ttl(request.ttl());
      return grpc::Status::OK;
    }});
    const Status status = StoreOn(fake).store->set("0.job", "a", "x", 2s);
    INFO(status.to_string());
    CHECK(status.code() == ErrorCode::kProtocol);
    CHECK_THAT(status.message(), Catch::Contains(fake.address()) && Catch::Contains("not etcd's answer"));
    CHECK(fake.calls("Put") == 0);
  }
  SECTION("a count or a read at the end of int64's range: refused, not overflowed") {
    FakeEtcd fake({.txn = [](const std::string&, const etcdserverpb::TxnRequest& request,
                             etcdserverpb::TxnResponse* r) {
      r->mutable_header()->set_revision(std::numeric_limits<int64_t>::max());
      r->set_succeeded(true);
      for (int i = 0; i < request.success_size(); ++i) {
        auto* one = r->add_responses();
        if (request.success(i).has_request_put()) {
          one->mutable_response_put()->mutable_prev_kv()->set_version(std::numeric_limits<int64_t>::max());
        } else {
          one->mutable_response_range();
        }
      }
      return grpc::Status::OK;
    }});
    StoreOn node(fake);
    int64_t count = -1;
    const Status counted = node.store->add("0.job", "arrived", 1, 2s, &count);
    INFO(counted.to_string());
    CHECK(counted.code() == ErrorCode::kProtocol);
    CHECK_THAT(counted.message(), Catch::Contains("found version 9223372036854775807"));
    std::vector<std::string> values;
    const Status read = node.store->get("0.job", {"a"}, 2s, &values);
    INFO(read.to_string());
    CHECK(read.code() == ErrorCode::kProtocol);
    CHECK_THAT(read.message(), Catch::Contains("revision 9223372036854775807"));
  }
  SECTION("a reply above the daemon's bound for one reply: refused, naming the bound, not taken whole") {
    FakeEtcd fake({.txn = [](const std::string&, const etcdserverpb::TxnRequest&, etcdserverpb::TxnResponse* r) {
      r->set_succeeded(true);
      auto* kv = r->add_responses()->mutable_response_range()->add_kvs();
      kv->set_value(std::string(EtcdAccess::kMaxReply + 1, 'x'));
      return grpc::Status::OK;
    }});
    std::vector<std::optional<std::string>> values;
    const Status status = StoreOn(fake).store->peek("0.job", {"a"}, 5s, &values);
    INFO(status.to_string().substr(0, 500));
    CHECK_FALSE(status.ok());
    CHECK_THAT(status.message(), Catch::Contains(fake.address()) && Catch::Contains("128 MiB"));
  }
  SECTION("a read whose 64 values together exceed that bound (a raised --max-request-bytes): fewer keys a "
          "transaction, down to one") {
    const size_t value = (EtcdAccess::kMaxReply / 2) + (8u << 20);  // two are above the bound, one is not
    FakeEtcd fake({.txn = [value](const std::string&, const etcdserverpb::TxnRequest& request,
                                  etcdserverpb::TxnResponse* r) {
      r->mutable_header()->set_revision(3);
      r->set_succeeded(true);
      for (int i = 0; i < request.success_size(); ++i) {
        auto* kv = r->add_responses()->mutable_response_range()->add_kvs();
        kv->set_key(request.success(i).request_range().key());
        kv->set_value(std::string(value, static_cast<char>('a' + i)));
      }
      return grpc::Status::OK;
    }});
    std::vector<std::string> values;
    const Status status = StoreOn(fake).store->get("0.job", {"a", "b"}, 10s, &values);
    INFO(status.to_string().substr(0, 500));
    REQUIRE(status.ok());
    REQUIRE(values.size() == 2);
    CHECK(values[0].size() == value);
    CHECK(values[1].size() == value);
    CHECK(fake.calls("Txn") == 3);  // both keys at once (refused), then one each
  }
  SECTION("a member that answers every watch with a compaction: read again after a pause, no busy loop") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = answering(compacted(5))});
    std::vector<std::string> values;
    const Status status = StoreOn(fake).store->get("0.job", {"a"}, 1s, &values);
    INFO(status.to_string());
    CHECK(status.code() == ErrorCode::kTimeout);
    // One read and one watch a pause (100 ms) at most, over the 1 s wait.
    CHECK(fake.calls("Watch") >= 2);
    CHECK(fake.calls("Watch") <= 12);
  }
  SECTION("a watch that ends well without the keys: refused at once, not waited out or retried") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = [](const std::string&, const etcdserverpb::WatchCreateRequest&, FakeEtcd::WatchStream*) {
                     return grpc::Status::OK;
                   }});
    std::vector<std::string> values;
    const auto start = Clock::now();
    const Status status = StoreOn(fake).store->get("0.job", {"a"}, 10s, &values);
    INFO(status.to_string());
    CHECK_FALSE(status.ok());
    CHECK_THAT(status.message(), Catch::Contains(fake.address()) && Catch::Contains("ended without the keys"));
    CHECK(Clock::now() - start < 5s);
    CHECK(fake.calls("Watch") == 1);
  }
  SECTION("a watch cancelled by the member for a reason of its own: the reason is the error") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = answering(cancelled("mvcc: the fake's own reason"))});
    std::vector<std::string> values;
    const Status status = StoreOn(fake).store->get("0.job", {"a"}, 10s, &values);
    INFO(status.to_string());
    CHECK_THAT(status.message(), Catch::Contains("the watch was cancelled: mvcc: the fake's own reason"));
  }
  SECTION("a watch's events of other keys are skipped, and a key put twice in one reply gives its latest value") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = [](const std::string&, const etcdserverpb::WatchCreateRequest& create,
                               FakeEtcd::WatchStream* s) {
                     // The watch starts after the revision the read answered at.
                     if (create.start_revision() != 8) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "rev");
                     s->Write(puts({{full("ab"), "another key"}, {full("a"), "old"}, {full("a"), "new"}}));
                     s->Write(puts({{full("c"), "not asked for"}, {full("b"), "b's"}}));
                     FakeEtcd::hold(s);
                     return grpc::Status::OK;
                   }});
    std::vector<std::string> values;
    const Status status = StoreOn(fake).store->get("0.job", {"b", "a"}, 10s, &values);
    INFO(status.to_string());
    REQUIRE(status.ok());
    CHECK(values == std::vector<std::string>{"b's", "new"});
  }
}

TEST_CASE("etcd store: a watch refused as 'permission denied' (etcd 3.4's word for a token it cannot check) logs "
          "in again once, and a call refused for its token is made again with a new one",
          "[unit][etcd]") {
  SECTION("the second token is taken: the get gets its key") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = [](const std::string& token, const etcdserverpb::WatchCreateRequest&,
                               FakeEtcd::WatchStream* s) {
                     s->Write(token == "token-1" ? cancelled("etcdserver: permission denied")
                                                 : puts({{full("a"), "with " + token}}));
                     FakeEtcd::hold(s);
                     return grpc::Status::OK;
                   }});
    std::vector<std::string> values;
    const Status status = StoreOn(fake, "trainer-nodes").store->get("0.job", {"a"}, 10s, &values);
    INFO(status.to_string());
    REQUIRE(status.ok());
    CHECK(values == std::vector<std::string>{"with token-2"});
    CHECK(fake.calls("Authenticate") == 2);
    CHECK(fake.calls("Watch") == 2);
  }
  SECTION("refused again: the refusal is the error, after one more login, not a loop") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = answering(cancelled("etcdserver: permission denied"))});
    std::vector<std::string> values;
    const Status status = StoreOn(fake, "trainer-nodes").store->get("0.job", {"a"}, 10s, &values);
    INFO(status.to_string());
    CHECK_FALSE(status.ok());
    CHECK_THAT(status.message(), Catch::Contains("the watch was refused: etcdserver: permission denied"));
    CHECK(fake.calls("Authenticate") == 2);
    CHECK(fake.calls("Watch") == 2);
  }
  SECTION("without a user, 'permission denied' is what it says: no login, no second watch") {
    FakeEtcd fake({.txn = nothing_there,
                   .watch = answering(cancelled("etcdserver: permission denied"))});
    std::vector<std::string> values;
    const Status status = StoreOn(fake).store->get("0.job", {"a"}, 10s, &values);
    INFO(status.to_string());
    CHECK(status.code() == ErrorCode::kPermissionDenied);
    CHECK(fake.calls("Authenticate") == 0);
    CHECK(fake.calls("Watch") == 1);
  }
  SECTION("a write refused as 'invalid auth token' is made once more with a new token") {
    Mutex mutex;
    std::vector<std::string> tokens;  // the Put calls' tokens, in order (one call at a time)
    FakeEtcd fake({.put = [&](const std::string& token, const etcdserverpb::PutRequest&, etcdserverpb::PutResponse*) {
      MutexLock lock(mutex);
      tokens.push_back(token);
      return token == "token-1" ? grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "etcdserver: invalid auth token")
                                : grpc::Status::OK;
    }});
    const Status status = StoreOn(fake, "trainer-nodes").store->set("0.job", "a", "x", 5s);
    INFO(status.to_string());
    CHECK(status.ok());
    MutexLock lock(mutex);
    CHECK(tokens == std::vector<std::string>{"token-1", "token-2"});
  }
}

TEST_CASE("etcd store: a renewal that finds the node's lease gone (TTL 0): the next write grants another",
          "[unit][etcd]") {
  Mutex mutex;
  std::vector<int64_t> put_leases;
  FakeEtcd fake({.put = [&](const std::string&, const etcdserverpb::PutRequest& request, etcdserverpb::PutResponse*) {
                   MutexLock lock(mutex);
                   put_leases.push_back(request.lease());
                   return grpc::Status::OK;
                 },
                 .renew = [](const etcdserverpb::LeaseKeepAliveRequest&,
                             etcdserverpb::LeaseKeepAliveResponse* response) { response->set_ttl(0); }});
  StoreOn node(fake, {}, 2s);  // renewed every 2/3 s
  REQUIRE(node.store->set("0.job", "a", "x", 2s).ok());
  // Writes until one takes a new lease: the renewal's answer is read and acted on by the
  // renewal thread, at a time of its own.
  const auto deadline = Clock::now() + 10s;
  while (fake.calls("LeaseGrant") < 2 && Clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    REQUIRE(node.store->set("0.job", "a", "y", 2s).ok());
  }
  CHECK(fake.calls("LeaseKeepAlive") > 0);
  CHECK(fake.calls("LeaseGrant") == 2);
  MutexLock lock(mutex);
  REQUIRE(put_leases.size() >= 2);
  CHECK(put_leases.front() != 0);
  CHECK(put_leases.back() != 0);
  CHECK(put_leases.front() != put_leases.back());
}

TEST_CASE("etcd store: the job's lease is renewed while the session lives, every third of its own TTL, as the "
          "node's is",
          "[unit][etcd]") {
  // (node TTL, job TTL, fewest and most renewals of the node's lease, and of the job's, in 3.5 s)
  const auto [node_ttl, job_ttl, node_least, node_most, job_least, job_most] =
      GENERATE(std::make_tuple(3, 3, 2, 4, 2, 4),     // both every second
               std::make_tuple(3, 12, 2, 4, 0, 1),    // the job's every 4 s: once at most
               std::make_tuple(12, 3, 0, 1, 2, 4));   // the job's below the node's: still every second
  INFO("node TTL " << node_ttl << " s, job TTL " << job_ttl << " s");
  Mutex mutex;
  std::map<int64_t, int> renewals;  // by lease
  std::vector<int64_t> granted;     // in order: the job's lease (the count), then the node's (the set)
  FakeEtcd fake({.txn =
                     [](const std::string&, const etcdserverpb::TxnRequest& request, etcdserverpb::TxnResponse* r) {
                       r->set_succeeded(true);
                       for (int i = 0; i < request.success_size(); ++i) r->add_responses();
                       return grpc::Status::OK;
                     },
                 .put = [](const std::string&, const etcdserverpb::PutRequest&,
                           etcdserverpb::PutResponse*) { return grpc::Status::OK; },
                 .grant =
                     [&](const std::string&, const etcdserverpb::LeaseGrantRequest& request,
                         etcdserverpb::LeaseGrantResponse* r) {
                       MutexLock lock(mutex);
                       granted.push_back(request.id());
                       r->set_id(request.id());
                       r->set_ttl(request.ttl());
                       return grpc::Status::OK;
                     },
                 .renew = [&](const etcdserverpb::LeaseKeepAliveRequest& request,
                              etcdserverpb::LeaseKeepAliveResponse*) {
                   MutexLock lock(mutex);
                   ++renewals[request.id()];
                 }});
  {
    StoreOn node(fake, {}, std::chrono::seconds(node_ttl), std::chrono::seconds(job_ttl));
    int64_t count = 0;
    REQUIRE(node.store->add("0.job", "incarnations", 1, 2s, &count).ok());  // the job's lease
    REQUIRE(node.store->set("0.job", "g0/node/0", "mine", 2s).ok());         // the node's
    std::this_thread::sleep_for(3500ms);
  }
  MutexLock lock(mutex);
  REQUIRE(granted.size() == 2);
  const int64_t job_lease = granted[0], node_lease = granted[1];
  INFO("node lease renewed " << renewals[node_lease] << " times, job lease " << renewals[job_lease]);
  CHECK(renewals[node_lease] >= node_least);
  CHECK(renewals[node_lease] <= node_most);
  CHECK(renewals[job_lease] >= job_least);  // before, the job's never
  CHECK(renewals[job_lease] <= job_most);
}

}  // namespace gradsync::test
