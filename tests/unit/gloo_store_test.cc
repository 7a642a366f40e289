// The Gloo store over the peer service (daemon/engine/gloo/store.h): a mesh's key families are
// fetched whole, in replies small enough for gRPC, and each key answers with its own value.
#include "daemon/engine/gloo/store.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/gloo/address_scrub.h"
#include "daemon/engine/gloo/engine.h"
#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_server.h"
#include "tests/unit/memory_store.h"

namespace gradsync {

using namespace std::chrono_literals;

TEST_CASE("gloo store: 200 ranks' address lists, 5.4 MB in all, come back whole and each its own",
          "[gloo_store]") {
  // One reply for the whole "<r>" family would be past gRPC's 4 MiB limit (it was, at about 170
  // ranks); the store asks in batches of about 1 MiB.
  auto auth = std::make_shared<PeerAuth>();
  auth->token = "0123456789abcdef0123456789abcdef-gloo-store";
  auth->node = "node0";
  auth->instance_secret = PeerAuth::make_secret();
  PeerServer server(PeerServerOptions{"127.0.0.1:0", Logger(LogLevel::kError), {}, auth, {}});
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  auto client = std::make_shared<PeerClient>(address, auth);
  int64_t incarnation = 0;
  REQUIRE(client->add("0.job", "incarnations", 1, 2s, &incarnation).ok());
  REQUIRE(client->set("0.job", "g0/node/0", "", 2s).ok());  // a node of generation 0 (key_scope.h)
  constexpr int kRanks = 200;
  const auto value_of = [](int r) { return std::string(136 * kRanks, static_cast<char>('a' + r % 26)) + std::to_string(r); };
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(client->set("0.job", "g0/group/dp/" + std::to_string(r), value_of(r), 2s).ok());
  }
  PeerStore store(client, "0.job", "g0/group/dp/", 10s, /*tcp_addresses=*/false, kRanks, /*rank=*/0);
  store.wait({"150"});
  for (int r : {0, 99, 150, 199}) {
    const std::vector<char> got = store.get(std::to_string(r));
    CHECK(std::string(got.begin(), got.end()) == value_of(r));
  }
}

}  // namespace gradsync

namespace gradsync {
namespace {

// One rank's view of a shared store, counting the bytes its gets took.
class CountingStore final : public RendezvousStore {
 public:
  explicit CountingStore(std::shared_ptr<MemoryStore> store) : store_(std::move(store)) {}
  std::string describe() const override { return store_->describe(); }
  Status set(const std::string& job, const std::string& key, const std::string& value,
             std::chrono::milliseconds timeout) override {
    return store_->set(job, key, value, timeout);
  }
  Status set_if_absent(const std::string& job, const std::string& key, const std::string& value,
                       std::chrono::milliseconds timeout, bool* stored) override {
    return store_->set_if_absent(job, key, value, timeout, stored);
  }
  Status get(const std::string& job, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
             std::vector<std::string>* values) override {
    const Status status = store_->get(job, keys, timeout, values);
    if (status.ok()) {
      for (const auto& value : *values) bytes_read += value.size();
    }
    return status;
  }
  Status add(const std::string& job, const std::string& key, int64_t delta, std::chrono::milliseconds timeout,
             int64_t* value) override {
    return store_->add(job, key, delta, timeout, value);
  }
  Status delete_job(const std::string&, std::chrono::milliseconds, const std::string&) override { return Status(); }
  void cancel(const Status&) override {}
  std::shared_ptr<RendezvousStore> fresh() const override { return nullptr; }

  std::atomic<size_t> bytes_read{0};

 private:
  std::shared_ptr<MemoryStore> store_;
};

constexpr char kJob[] = "0.job";
constexpr char kPrefix[] = "g0/group/dp/";

}  // namespace

TEST_CASE("gloo store: 8 real Gloo contexts form a full mesh from transposed address lists, and allreduce",
          "[gloo_store]") {
  // Each rank but 0 reads its column of the pair addresses (7 of them), not all 8 lists of 7:
  // N addresses per node where it was N², and the mesh still connects every pair right.
  constexpr int kRanks = 8;
  auto shared = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<CountingStore>> views;
  std::vector<std::unique_ptr<PeerStore>> stores;
  for (int r = 0; r < kRanks; ++r) {
    views.push_back(std::make_shared<CountingStore>(shared));
    stores.push_back(std::make_unique<PeerStore>(views.back(), kJob, kPrefix, 20s, /*tcp_addresses=*/true, kRanks, r));
  }
  std::vector<std::unique_ptr<HostCollectiveEngine>> engines(kRanks);
  std::vector<std::future<Status>> made;
  for (int r = 0; r < kRanks; ++r) {
    made.push_back(std::async(std::launch::async, [&, r] {
      EngineSpec spec;
      spec.job = "gloo-store-test";
      spec.prefix = kPrefix;
      spec.node = r;
      spec.nodes = kRanks;
      spec.timeout = 20s;
      return gloo_engine::make_engine(spec, GlooTransport{}, *stores[r], &engines[r]);
    }));
  }
  for (auto& m : made) REQUIRE(m.get().ok());

  // Every pair is connected to the right peer: a sum over all 8 comes out exact everywhere.
  std::vector<std::shared_ptr<std::vector<float>>> data;
  std::vector<std::future<Status>> sums;
  for (int r = 0; r < kRanks; ++r) {
    data.push_back(std::make_shared<std::vector<float>>(4096, float(r + 1)));
    auto answer = std::make_shared<std::promise<Status>>();
    sums.push_back(answer->get_future());
    engines[r]->allreduce(data[r]->data(), data[r]->size(), ReduceSpec{},
                          [answer, keep = data[r]](const Status& s) { answer->set_value(s); });
  }
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(sums[r].wait_for(20s) == std::future_status::ready);
    REQUIRE(sums[r].get().ok());
    for (float x : *data[r]) REQUIRE(x == 36.0f);
  }

  const size_t address = gloo_engine::tcp_address_bytes();
  const size_t lists = kRanks * (kRanks - 1) * address;  // every rank's list of pair addresses
  CHECK(views[0]->bytes_read >= lists);  // rank 0 reads them all, once, to transpose them
  for (int r = 1; r < kRanks; ++r) {
    INFO("rank " << r << " read " << views[r]->bytes_read << " bytes; the lists are " << lists);
    // Its column (7 addresses) and the 8 host names: well under the lists' 7,616 bytes.
    CHECK(views[r]->bytes_read < (kRanks - 1) * address + 1024);
  }
  for (auto& engine : engines) engine->abort(Status::aborted("test over"));
}

TEST_CASE("gloo store: lists that are not N - 1 addresses of one size are read whole by every rank", "[gloo_store]") {
  // Another Gloo's layout: rank 0 cannot transpose it, says so in every column, and each rank
  // reads the lists as they were published.
  constexpr int kRanks = 3;
  auto shared = std::make_shared<MemoryStore>();
  const std::vector<std::string> lists = {std::string(20, 'a'), std::string(30, 'b'), std::string(20, 'c')};
  for (int r = 0; r < kRanks; ++r) shared->put(kJob, kPrefix + std::to_string(r), lists[r]);
  PeerStore rank0(shared, kJob, kPrefix, 5s, false, kRanks, 0);
  PeerStore rank2(shared, kJob, kPrefix, 5s, false, kRanks, 2);
  const std::vector<char> got0 = rank0.get("1");
  CHECK(std::string(got0.begin(), got0.end()) == lists[1]);
  const std::vector<char> got2 = rank2.get("1");
  CHECK(std::string(got2.begin(), got2.end()) == lists[1]);
}

TEST_CASE("gloo store: a column that is not N - 1 addresses of one size is refused, naming rank 0", "[gloo_store]") {
  auto shared = std::make_shared<MemoryStore>();
  shared->put(kJob, std::string(kPrefix) + "col_1", std::string(7, 'x'));  // 3 ranks: 2 addresses expected
  PeerStore rank1(shared, kJob, kPrefix, 5s, false, 3, 1);
  try {
    rank1.get("0");
    FAIL("a column of 7 bytes for 2 addresses was taken");
  } catch (const Error& e) {
    CHECK(e.status().code() == ErrorCode::kProtocol);
    CHECK_THAT(e.status().message(), Catch::Contains("rank 0 of the Gloo mesh published a column of 7 bytes for rank 1"));
  }
}

}  // namespace gradsync
