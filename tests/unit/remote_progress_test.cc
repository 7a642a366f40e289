// The admin view's questions to the other nodes of its jobs (daemon/admin/remote_progress.h):
// waves of calls start only while the view's answer bound lasts, and the nodes left are "not
// asked", never unreachable. Without the bound, silent nodes held the view for a probe bound
// per wave of 16.
#include "daemon/admin/remote_progress.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <chrono>
#include <thread>

namespace gradsync::admin {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<NodeToAsk> nodes_of(size_t count, size_t jobs) {
  std::vector<NodeToAsk> nodes;
  for (size_t i = 0; i < count; ++i) {
    nodes.push_back(NodeToAsk{i % jobs, static_cast<int>(i + 1), "10.0.0." + std::to_string(i) + ":7000"});
  }
  return nodes;
}

// A node that takes the whole probe bound and then is unreachable, as a silent one does.
AskNode silent(std::chrono::milliseconds probe, std::atomic<int>* asked) {
  return [probe, asked](const NodeToAsk& node) {
    asked->fetch_add(1);
    std::this_thread::sleep_for(probe);
    RemoteNode remote;
    remote.node = node.node;
    remote.address = node.address;
    remote.unreachable = true;
    remote.error = "Deadline Exceeded";
    return remote;
  };
}

}  // namespace

TEST_CASE("admin view: silent nodes past the view's answer bound are not asked, and the view answers in bound",
          "[unit][admin]") {
  // 320 silent nodes, 500 ms each: 20 waves, 10 s unbounded. The bound (150 ms) passes during
  // the first wave, so exactly one wave is asked, however the machine schedules the threads.
  std::atomic<int> asked{0};
  const auto start = Clock::now();
  const auto remotes = ask_nodes(nodes_of(320, 2), 2, start + 150ms, silent(500ms, &asked));
  const auto took = Clock::now() - start;
  CHECK(took < 3s);
  CHECK(asked.load() == static_cast<int>(kParallelAsks));
  REQUIRE(remotes.size() == 2);
  size_t unreachable = 0, not_asked = 0;
  for (size_t job = 0; job < remotes.size(); ++job) {
    REQUIRE(remotes[job].size() == 160);
    for (size_t k = 0; k < remotes[job].size(); ++k) {
      const RemoteNode& remote = remotes[job][k];
      CHECK(remote.node == static_cast<int>(2 * k + job + 1));  // in the order given, by job
      CHECK(remote.unreachable != remote.not_asked);
      if (remote.unreachable) ++unreachable;
      if (remote.not_asked) {
        ++not_asked;
        CHECK(remote.error == "not asked: the view's time to answer ran out first");
      }
    }
  }
  CHECK(unreachable == kParallelAsks);
  CHECK(not_asked == 320 - kParallelAsks);
}

TEST_CASE("admin view: a call that throws reports its node unreachable, the others answered", "[unit][admin]") {
  const AskNode ask = [](const NodeToAsk& node) -> RemoteNode {
    if (node.node == 2) throw std::runtime_error("no channel");
    RemoteNode remote;
    remote.node = node.node;
    return remote;
  };
  const auto remotes = ask_nodes(nodes_of(3, 1), 1, Clock::now() + 10s, ask);
  REQUIRE(remotes[0].size() == 3);
  CHECK_FALSE(remotes[0][0].unreachable);
  CHECK(remotes[0][1].unreachable);
  CHECK(remotes[0][1].error == "asking it failed: no channel");
  CHECK_FALSE(remotes[0][2].unreachable);
}

TEST_CASE("admin view: every node is asked while the bound lasts", "[unit][admin]") {
  std::atomic<int> asked{0};
  const auto remotes = ask_nodes(nodes_of(40, 1), 1, Clock::now() + 10s, silent(1ms, &asked));
  CHECK(asked.load() == 40);
  REQUIRE(remotes.size() == 1);
  REQUIRE(remotes[0].size() == 40);
  for (const RemoteNode& remote : remotes[0]) CHECK_FALSE(remote.not_asked);
}

TEST_CASE("admin view: a bound already over asks nobody", "[unit][admin]") {
  std::atomic<int> asked{0};
  const auto remotes = ask_nodes(nodes_of(3, 1), 1, Clock::now() - 1ms, silent(1ms, &asked));
  CHECK(asked.load() == 0);
  REQUIRE(remotes[0].size() == 3);
  for (const RemoteNode& remote : remotes[0]) CHECK(remote.not_asked);
}

}  // namespace gradsync::admin
