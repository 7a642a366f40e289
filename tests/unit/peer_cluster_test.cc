// A multi-node job's cluster (daemon/job/peer_cluster.h) against a rendezvous store that answers
// what no gradsyncd or etcd would: a count of incarnations below 1, and a node's layout record
// of a million tensors. The store is an in-memory map; the other node's keys are written into it
// directly, as a hostile member could.
#include "daemon/job/peer_cluster.h"

#include <catch2/catch.hpp>

#include <chrono>

#include "daemon/job/layout_record.h"
#include "daemon/job/node_record.h"
#include "daemon/model/topology.h"
#include "tests/unit/memory_store.h"

namespace gradsync {
namespace {

using namespace std::chrono_literals;

constexpr char kStoreJob[] = "0.j";

// Node 0 of a job of two nodes with one rank each, forming through `store`.
ClusterOptions node0_of_two(std::shared_ptr<MemoryStore> store) {
  ClusterOptions options;
  options.job_id = "j";
  options.store_job = kStoreJob;
  REQUIRE(make_topology(2, 1, 0, 0, {}, &options.topology).ok());
  options.timeout = 2000ms;
  options.rendezvous = "127.0.0.1:1";
  options.store = std::move(store);
  options.advertise = "127.0.0.1:7000";
  options.log = Logger(LogLevel::kError);
  return options;
}

TensorSet one_tensor_set() {
  TensorSet set;
  set.id = 3;
  set.layout = {plan::TensorLayout{DType::kFloat32, 1024, "dp"}};
  set.bucket_cap = 1 << 20;
  return set;
}

}  // namespace

TEST_CASE("peer cluster: a rendezvous that counts fewer than one incarnation is refused, naming it",
          "[unit][cluster]") {
  for (const int64_t answer : {int64_t{0}, int64_t{-3}}) {
    auto store = std::make_shared<MemoryStore>();
    store->count_answer = answer;
    PeerCluster cluster(node0_of_two(store));
    const Status status = cluster.form();
    CHECK(status.code() == ErrorCode::kProtocol);
    CHECK_THAT(status.message(), Catch::Contains("the rendezvous (the test's store) counted " + std::to_string(answer) +
                                                 " incarnations after this node's: not a count"));
    CHECK(store->size() == 0);  // nothing published under a generation made of it
  }
}

TEST_CASE("peer cluster: a node's layout record of a million tensors is refused by its counts", "[unit][cluster]") {
  auto store = std::make_shared<MemoryStore>();
  store->put(kStoreJob, "g0/node/1", NodeRecord::mine(1, "127.0.0.1:7001").encode());
  PeerCluster cluster(node0_of_two(store));
  REQUIRE(cluster.form().ok());
  const TensorSet set = one_tensor_set();
  SECTION("the same first tensor, then a million more") {
    // Node 1 answers node 0's record with its own first tensor and a million more after it,
    // under another fingerprint: a record no gradsyncd of this set would write.
    store->on_set = [&](const std::string& key, const std::string& value) {
      if (key != "g0/set/3/layout/0") return;
      const size_t head = value.find('\n');
      std::string forged = "1" + value.substr(head);
      for (int i = 0; i < 1'000'000; ++i) forged += "1 1024 dp\n";
      store->put(kStoreJob, "g0/set/3/layout/1", forged);
    };
    const Status status = cluster.check_layout(set);
    CHECK(status.code() == ErrorCode::kLayoutMismatch);
    CHECK_THAT(status.message(), Catch::Contains("rank 0 registered 1 tensors, rank 1 registered 1000001"));
  }
  SECTION("a differing tensor within the first ones kept is named as such") {
    store->on_set = [&](const std::string& key, const std::string& value) {
      if (key != "g0/set/3/layout/0") return;
      const size_t head = value.find('\n', value.find('\n') + 1);
      std::string forged = "1" + value.substr(value.find('\n'), head - value.find('\n') + 1) + "1 2048 dp\n";
      for (int i = 0; i < 1000; ++i) forged += "1 1024 dp\n";
      store->put(kStoreJob, "g0/set/3/layout/1", forged);
    };
    const Status status = cluster.check_layout(set);
    CHECK(status.code() == ErrorCode::kLayoutMismatch);
    CHECK_THAT(status.message(), Catch::Contains("1024"));
    CHECK_THAT(status.message(), Catch::Contains("2048"));
  }
}

TEST_CASE("layout record: a record of a million tensors is decoded only as far as asked, and counted whole",
          "[unit][cluster]") {
  TensorSet set = one_tensor_set();
  std::string record = encode_layout(set);
  for (int i = 0; i < 1'000'000; ++i) record += "1 1024 dp\n";
  uint64_t fingerprint = 0, cap = 0;
  int gather = 0;
  MaskRecord mask;
  std::vector<plan::TensorLayout> layout;
  size_t total = 0;
  REQUIRE(decode_layout(record, 2, &fingerprint, &cap, &gather, &mask, &layout, &total));
  CHECK(layout.size() == 2);  // the set's own count plus one: never the million
  CHECK(total == 1'000'001);
  CHECK(layout[0].numel == 1024);
  CHECK(cap == set.bucket_cap);
  // A dtype no gradsyncd writes, anywhere in the record, makes it undecodable.
  CHECK_FALSE(decode_layout(record + "0 1 dp\n", 2, &fingerprint, &cap, &gather, &mask, &layout, &total));
}

}  // namespace gradsync
