// The Gloo store over the peer service (daemon/engine/gloo/store.h): a mesh's key families are
// fetched whole, in replies small enough for gRPC, and each key answers with its own value.
#include "daemon/engine/gloo/store.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_server.h"

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
  PeerStore store(client, "0.job", "g0/group/dp/", 10s, /*tcp_addresses=*/false, kRanks);
  store.wait({"150"});
  for (int r : {0, 99, 150, 199}) {
    const std::vector<char> got = store.get(std::to_string(r));
    CHECK(std::string(got.begin(), got.end()) == value_of(r));
  }
}

}  // namespace gradsync
