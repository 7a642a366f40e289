// Pinging many peer daemons at once (daemon/peer/peer_pings.h): one bound for them all, and
// the peers past the bound's end reported as not asked. Frozen peers are listening sockets
// nobody accepts on (the kernel completes the handshake; nothing ever answers), gone ones
// ports nobody listens on. A peer that answers is the cluster tests' (tests/cluster).
#include "daemon/peer/peer_pings.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include <chrono>

#include "shared/unique_fd.h"

namespace gradsync {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A loopback listener that never accepts: "127.0.0.1:PORT" of a frozen daemon.
struct FrozenPeer {
  FrozenPeer() : fd(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd.get() >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(fd.get(), 16) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  UniqueFd fd;
  int port = 0;
};

// A port nobody listens on, just released: a gone daemon.
std::string gone_peer() {
  FrozenPeer released;
  const std::string address = released.address();
  return address;  // the listener closes as `released` goes
}

}  // namespace

TEST_CASE("peer pings: every frozen and gone peer is asked at once, within one bound whatever their number",
          "[unit][peer]") {
  std::vector<FrozenPeer> frozen(8);
  std::vector<std::string> addresses;
  for (const auto& peer : frozen) addresses.push_back(peer.address());
  for (int i = 0; i < 8; ++i) addresses.push_back(gone_peer());
  const auto start = Clock::now();
  const std::vector<PingAnswer> answers = ping_all(addresses, nullptr, 500ms);
  const auto took = Clock::now() - start;
  CHECK(took >= 450ms);  // the frozen ones are waited for to the bound
  CHECK(took < 1500ms);  // once, not once per peer (16 peers: 8 s one after another)
  REQUIRE(answers.size() == addresses.size());
  for (size_t i = 0; i < answers.size(); ++i) {
    INFO(addresses[i]);
    CHECK(answers[i] == PingAnswer::kSilent);
  }
}

TEST_CASE("peer pings: peers whose turn comes after the bound are not asked, not silent", "[unit][peer]") {
  std::vector<FrozenPeer> frozen(3);
  std::vector<std::string> addresses;
  for (const auto& peer : frozen) addresses.push_back(peer.address());
  const auto start = Clock::now();
  const std::vector<PingAnswer> answers = ping_all(addresses, nullptr, 300ms, 1);  // one open at a time
  CHECK(Clock::now() - start < 1500ms);
  CHECK(answers == std::vector<PingAnswer>{PingAnswer::kSilent, PingAnswer::kNotAsked, PingAnswer::kNotAsked});
}

}  // namespace gradsync
