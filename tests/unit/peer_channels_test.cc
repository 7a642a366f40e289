// The daemon's channels to its peers (daemon/peer/peer_channels.h): one per address, the least
// recently used going first when the cap is reached, and still usable by whoever holds it.
#include "daemon/peer/peer_channels.h"

#include <catch2/catch.hpp>

namespace gradsync {
namespace {

TEST_CASE("peer channels: one channel per address, shared by every asker", "[unit][peer]") {
  PeerChannels channels;
  const auto credentials = grpc::InsecureChannelCredentials();
  const auto a = channels.get("127.0.0.1:1", credentials);
  CHECK(channels.get("127.0.0.1:1", credentials) == a);
  CHECK(channels.get("127.0.0.1:2", credentials) != a);
  CHECK(channels.size() == 2);
}

TEST_CASE("peer channels: beyond the cap the least recently used goes, alive for its holders", "[unit][peer]") {
  PeerChannels channels(2);
  const auto credentials = grpc::InsecureChannelCredentials();
  const auto first = channels.get("127.0.0.1:1", credentials);
  const auto second = channels.get("127.0.0.1:2", credentials);
  CHECK(channels.get("127.0.0.1:1", credentials) == first);  // now the more recent of the two
  channels.get("127.0.0.1:3", credentials);                  // the cap: :2 goes
  CHECK(channels.size() == 2);
  CHECK(channels.get("127.0.0.1:1", credentials) == first);
  CHECK(channels.get("127.0.0.1:2", credentials) != second);  // made anew
  CHECK(second->GetState(false) != GRPC_CHANNEL_SHUTDOWN);    // the holder's copy still works
}

}  // namespace
}  // namespace gradsync
