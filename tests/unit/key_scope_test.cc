// The peer store's key scope (daemon/peer/key_scope.h): who may take a node, write, read, count
// and delete which keys of a job.
#include <catch2/catch.hpp>

#include "daemon/peer/key_scope.h"
#include "daemon/peer/peer_requests.h"

namespace gradsync {
namespace {

constexpr char kJob[] = "0.job";

struct Fixture {
  KvStore store;
  std::optional<KeyScope::LocalJob> local;
  KeyScope scope{&store, [this](const std::string&) { return local; }};

  void begin(int count) {
    int64_t value = 0;
    for (int i = 0; i < count; ++i) REQUIRE(store.add(kJob, "incarnations", 1, &value).ok());
  }
  Status set(const std::string& key, const std::string& who, bool if_absent = false) {
    Status s = scope.may_set(kJob, key, if_absent, who);
    if (s.ok()) s = store.set(kJob, key, "v");
    return s;
  }
};

}  // namespace

TEST_CASE("key scope: a node is taken once, in a generation that has begun, by number as written",
          "[key_scope]") {
  Fixture f;
  CHECK(f.set("g0/node/0", "a").code() == ErrorCode::kPermissionDenied);  // nobody counted an incarnation
  f.begin(2);
  CHECK(f.set("g0/node/0", "a").ok());
  CHECK(f.set("g0/node/0", "a").ok());  // the taker again: idempotent
  CHECK_THAT(f.set("g0/node/0", "b").message(), Catch::Contains("already taken"));
  CHECK(f.set("g0/node/1", "b").ok());
  CHECK(f.set("g2/node/0", "c").code() == ErrorCode::kPermissionDenied);  // incarnations 2: g0 and g1 only
  CHECK(f.set("g00/node/0", "c").code() == ErrorCode::kPermissionDenied);
  CHECK(f.set("g0/node/01", "c").code() == ErrorCode::kPermissionDenied);
  CHECK(f.set("g0/node/+1", "c").code() == ErrorCode::kPermissionDenied);
  CHECK(f.set("g0/node/1/x", "c").code() == ErrorCode::kPermissionDenied);
  CHECK(f.set("g0/~claim/5", "a").code() == ErrorCode::kInvalidArgument);
  CHECK(f.scope.may_set(kJob, "g0/node/3", false, "").code() == ErrorCode::kPermissionDenied);  // no instance
}

TEST_CASE("key scope: where this daemon runs the job, claims stay within its nodes and node 0 is its own",
          "[key_scope]") {
  Fixture f;
  f.local = KeyScope::LocalJob{2, "self"};
  f.begin(2);
  CHECK_THAT(f.set("g0/node/0", "stranger").message(), Catch::Contains("rendezvous daemon's own"));
  CHECK(f.set("g0/node/0", "self").ok());
  CHECK_THAT(f.set("g0/node/2", "stranger").message(), Catch::Contains("the job has 2 nodes"));
  CHECK_THAT(f.set("g1/node/1", "stranger").message(), Catch::Contains("has not begun"));  // 2 counts: g0
  // Refusals derived from this daemon's node count name the likely cause: another local world size.
  CHECK_THAT(f.set("g0/node/2", "stranger").message(), Catch::Contains("local world sizes differ"));
  CHECK(f.set("g0/node/1", "peer").ok());
}

TEST_CASE("key scope: members write their own node's keys, shared keys once, counters by add only",
          "[key_scope]") {
  Fixture f;
  f.begin(1);
  REQUIRE(f.set("g0/node/0", "a").ok());
  REQUIRE(f.set("g0/node/1", "b").ok());
  CHECK(f.set("g0/set/1/layout/0", "a").ok());
  CHECK_THAT(f.set("g0/set/1/layout/1", "a").message(), Catch::Contains("belongs to node 1"));
  CHECK_THAT(f.set("g0/set/1/layout/0", "stranger").message(), Catch::Contains("holds no node of g0"));
  CHECK(f.set("g0/group/dp/0", "a").ok());
  CHECK_THAT(f.set("g0/group/dp/0", "b").message(), Catch::Contains("already set"));
  CHECK_THAT(f.set("g0/cfg/1", "a").message(), Catch::Contains("set-if-absent"));
  CHECK(f.set("g0/cfg/1", "a", true).ok());
  CHECK_THAT(f.set("g0/ended", "a").message(), Catch::Contains("by add only"));
  CHECK_THAT(f.set("g0/cfg/count", "a").message(), Catch::Contains("by add only"));
  CHECK(f.set("g0/anything", "a").code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_add(kJob, "g0/cfg/count", 1, "b").ok());
  CHECK(f.scope.may_add(kJob, "g0/cfg/count", 2, "b").code() == ErrorCode::kInvalidArgument);
  CHECK(f.scope.may_add(kJob, "incarnations", 1, "stranger").ok());
  CHECK(f.scope.may_add(kJob, "g0/ended", 1, "stranger").code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_get(kJob, {"g0/node/1"}, "a").ok());
  CHECK(f.scope.may_get(kJob, {"g0/node/1"}, "stranger").code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_get(kJob, {"g0/~member/a"}, "a").code() == ErrorCode::kInvalidArgument);
}

// A node's place is bound to the identity that took it (issue 24): the instance id alone is
// sent in the clear without TLS, so another member that learns it must not act as the node. The
// identity is what the caller proved (a certificate, or the node its token proofs declare), not
// its address: the same daemon reconnecting from another address keeps its place.
TEST_CASE("key scope: a node's keys answer only the instance and identity that took it", "[key_scope]") {
  Fixture f;
  f.begin(1);
  const StoreMember taker("host 10.0.0.1 node n1", "host 10.0.0.1", "node n1");
  const StoreMember moved("host fd00:: node n1", "host fd00::", "node n1");  // the same node, over IPv6
  const StoreMember other("host 10.0.0.1 node n9", "host 10.0.0.1", "node n9");  // another node's proofs
  REQUIRE(f.scope.may_set(kJob, "g0/node/1", false, "a", taker).ok());
  CHECK(f.scope.may_set(kJob, "g0/node/1", false, "a", taker).ok());  // idempotent for the taker
  CHECK(f.scope.may_set(kJob, "g0/node/1", false, "a", moved).ok());  // another address: still the taker
  CHECK_THAT(f.scope.may_set(kJob, "g0/node/1", false, "a", other).message(),
             Catch::Contains("bound to the identity that took it"));
  CHECK(f.scope.may_set(kJob, "g0/set/1/layout/1", false, "a", taker).ok());
  CHECK(f.scope.may_set(kJob, "g0/set/1/layout/1", false, "a", other).code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_get(kJob, {"g0/node/1"}, "a", moved).ok());
  CHECK(f.scope.may_get(kJob, {"g0/node/1"}, "a", other).code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_add(kJob, "g0/cfg/count", 1, "a", other).code() == ErrorCode::kPermissionDenied);
  // Taking a second node as another identity leaves nothing behind.
  CHECK(f.scope.may_set(kJob, "g0/node/2", false, "a", other).code() == ErrorCode::kPermissionDenied);
  std::string claim;
  CHECK_FALSE(f.store.peek(kJob, "g0/~claim/2", &claim));
  CHECK(f.scope.may_add(kJob, "g0/ended", 1, "a", other).code() == ErrorCode::kPermissionDenied);
  REQUIRE(f.scope.may_add(kJob, "g0/ended", 1, "a", taker).ok());
  CHECK(f.scope.may_delete(kJob, "g0/", "a", other).code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_delete(kJob, "g0/", "a", taker).ok());
}

TEST_CASE("key scope: each node counts its end once, a generation is deleted once every node ended",
          "[key_scope]") {
  Fixture f;
  f.begin(1);
  REQUIRE(f.set("g0/node/0", "a").ok());
  REQUIRE(f.set("g0/node/1", "b").ok());
  CHECK(f.scope.may_add(kJob, "g0/ended", 1, "a").ok());
  CHECK_THAT(f.scope.may_add(kJob, "g0/ended", 1, "a").message(), Catch::Contains("counted its end already"));
  CHECK(f.scope.may_add(kJob, "g0/ended", 0, "a").ok());  // a read
  CHECK_THAT(f.scope.may_delete(kJob, "g0/", "a").message(), Catch::Contains("1 of its 2 nodes have ended"));
  CHECK(f.scope.may_delete(kJob, "g0/", "b").code() == ErrorCode::kPermissionDenied);  // b has not ended
  CHECK(f.scope.may_add(kJob, "g0/ended", 1, "b").ok());
  CHECK(f.scope.may_delete(kJob, "g0/", "b").ok());
  CHECK(f.scope.may_delete(kJob, "g0/", "stranger").code() == ErrorCode::kPermissionDenied);
  CHECK(f.scope.may_delete(kJob, "", "a").code() == ErrorCode::kPermissionDenied);
}

// The second review: at its key quota, a node's "ended" took the last key for its marker and
// the counter's add was then refused, and every retry was told it had "counted its end
// already": the count stayed one short for good. Now the room for both is checked first, and
// a marker whose add fails is taken back.
TEST_CASE("key scope: an end refused at the member's quota leaves no marker, and counts once room is back",
          "[key_scope]") {
  KvStore::Limits limits;
  limits.max_member_keys = 4;
  KvStore store(limits);
  KeyScope scope(&store, {});
  const StoreMember member("host h node a", "host h");
  const PeerCaller caller{"inst-a", member};
  peer::AddRequest begin;
  begin.set_job(kJob);
  begin.set_key("incarnations");
  begin.set_delta(1);
  peer::AddReply added;
  REQUIRE(serve_add(store, scope, begin, PeerCaller{"inst-a", {}}, &added).ok());
  peer::SetRequest claim;
  claim.set_job(kJob);
  claim.set_key("g0/node/0");
  peer::SetReply set;
  REQUIRE(serve_set(store, scope, claim, caller, &set).ok());  // the claim, the membership and the record: 3 keys
  peer::AddRequest end;
  end.set_job(kJob);
  end.set_key("g0/ended");
  end.set_delta(1);
  const Status refused = serve_add(store, scope, end, caller, &added);
  CHECK(refused.code() == ErrorCode::kResourceExhausted);
  std::string marker;
  CHECK_FALSE(store.peek(kJob, "g0~ended/inst-a", &marker));
  // Room again (the record goes): the same end counts, once.
  REQUIRE(store.erase(kJob, "g0/node/0"));
  REQUIRE(serve_add(store, scope, end, caller, &added).ok());
  CHECK(added.value() == 1);
  CHECK_FALSE(serve_add(store, scope, end, caller, &added).ok());  // once only
  std::string count;
  REQUIRE(store.peek(kJob, "g0/ended", &count));
  CHECK(count == "1");
}

}  // namespace gradsync
