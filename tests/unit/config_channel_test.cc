// How the nodes of a job agree on settings changes, through a real peer service on loopback:
// changes are numbered in order, a number claimed but never published is given up so later
// changes are not blocked (and its late proposer is told), and agreement takes the largest
// offer or names the nodes that did not offer.
#include "daemon/job/config_channel.h"

#include <catch2/catch.hpp>

#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_server.h"

namespace gradsync {

using namespace std::chrono_literals;

TEST_CASE("config channel: numbered changes, a claimed but unpublished one given up, agreement on the largest offer",
          "[config_channel]") {
  // The cluster's token: without one, the peer service answers only Ping.
  const auto cluster = [] {
    auto auth = std::make_shared<PeerAuth>();
    auth->token = "0123456789abcdef0123456789abcdef-config";
    return auth;
  };
  PeerServer server(PeerServerOptions{"127.0.0.1:0", Logger(LogLevel::kError), {}, cluster(), {}});
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  // Each node is a daemon instance that took its node of the generation (key_scope.h).
  std::vector<std::shared_ptr<PeerAuth>> daemons;
  int64_t incarnation = 0;
  REQUIRE(PeerClient(address, cluster()).add("0.job", "incarnations", 1, 2s, &incarnation).ok());  // generation 0 began
  for (int n = 0; n < 2; ++n) {
    daemons.push_back(cluster());
    daemons.back()->node = "node" + std::to_string(n);
    daemons.back()->instance_secret = PeerAuth::make_secret();
    REQUIRE(PeerClient(address, daemons.back()).set("0.job", "g0/node/" + std::to_string(n), "", 2s).ok());
  }
  ConfigChannel node0(std::make_shared<PeerClient>(address, daemons[0]), "0.job", "g0/", 0, 2);
  ConfigChannel node1(std::make_shared<PeerClient>(address, daemons[1]), "0.job", "g0/", 1, 2);

  // A proposer claims change 1 and dies before publishing it.
  PeerClient crashed(address, cluster());
  REQUIRE(crashed.set("0.job", "g0/node/2", "a third daemon of the job", 2s).ok());  // a node of it
  int64_t claimed = 0;
  REQUIRE(crashed.add("0.job", "g0/cfg/count", 1, 2s, &claimed).ok());
  REQUIRE(claimed == 1);
  std::string text;
  CHECK(node1.wait(1, 50ms, &text).code() == ErrorCode::kTimeout);
  // A watcher gives it up; every node then reads "skip" for it, and its proposer's late
  // publication is refused.
  bool claimed_one = false;
  REQUIRE(node1.claimed(1, 2s, &claimed_one).ok());
  CHECK(claimed_one);
  REQUIRE(node1.give_up(1, 2s).ok());
  REQUIRE(node0.wait(1, 2s, &text).ok());
  CHECK(text == ConfigChannel::kSkip);
  bool stored = true;
  REQUIRE(crashed.set_if_absent("0.job", "g0/cfg/1", "v1 cap=1", 2s, &stored).ok());
  CHECK_FALSE(stored);
  // A number nobody claimed yet shows as such.
  bool claimed_two = true;
  REQUIRE(node1.claimed(2, 2s, &claimed_two).ok());
  CHECK_FALSE(claimed_two);

  // The next change gets number 2; the nodes offer where they are and agree on the largest.
  uint64_t k = 0;
  REQUIRE(node0.propose("v1 cap=4096", 2s, &k).ok());
  CHECK(k == 2);
  REQUIRE(node1.wait(2, 2s, &text).ok());
  CHECK(text == "v1 cap=4096");
  REQUIRE(node0.offer(2, 17, 2s).ok());
  uint64_t from = 0;
  const Status late = node0.agree(2, 100ms, &from);
  CHECK(late.code() == ErrorCode::kTimeout);
  CHECK_THAT(late.message(), Catch::Contains("node 1 did not offer an operation number within 100 ms"));
  REQUIRE(node1.offer(2, 18, 2s).ok());
  REQUIRE(node0.agree(2, 2s, &from).ok());
  CHECK(from == 18);
  REQUIRE(node1.agree(2, 2s, &from).ok());
  CHECK(from == 18);

  // A cancelled channel says so, and its calls fail at once.
  node1.cancel(Status::aborted("job over"));
  CHECK(node1.cancelled());
  CHECK_FALSE(node1.wait(3, 5s, &text).ok());
}

}  // namespace gradsync
