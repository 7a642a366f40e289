// How the admin view asks the other nodes of its multi-node jobs where each one is
// (GetInFlight across nodes): a few at a time, each call bounded by the probe bound, and new
// calls started only while the view's own answer bound lasts. A job of thousands of nodes, or
// one whose node list a hostile store made up, must not hold an operator's query for a probe
// bound per wave: the nodes whose turn had not come are reported as not asked, which the view
// does not count as behind.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "daemon/job/reports.h"

namespace gradsync::admin {

struct NodeToAsk {
  size_t job = 0;  // index of its job in the view's answer
  int node = 0;
  std::string address;  // its daemon's peer service
};

// Asks one node (a PeerClient progress call in the daemon), within the probe bound. Should it
// throw, the node is reported unreachable with the exception's text.
using AskNode = std::function<RemoteNode(const NodeToAsk&)>;

// At most this many calls at once.
inline constexpr size_t kParallelAsks = 16;

// One RemoteNode for every node of `nodes`, grouped by job (`jobs` groups), in the order given.
// Waves of calls start until `until`; the nodes left are not_asked. A call that cannot get a
// thread (the process is at its limit) is not_asked too, not unreachable. Every node's job is
// below `jobs`.
std::vector<std::vector<RemoteNode>> ask_nodes(const std::vector<NodeToAsk>& nodes, size_t jobs,
                                               std::chrono::steady_clock::time_point until, const AskNode& ask);

}  // namespace gradsync::admin
