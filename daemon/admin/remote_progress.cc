#include "daemon/admin/remote_progress.h"

#include <algorithm>
#include <future>
#include <optional>
#include <exception>
#include <string>

namespace gradsync::admin {
namespace {

RemoteNode not_asked(const NodeToAsk& node, const std::string& why) {
  RemoteNode remote;
  remote.node = node.node;
  remote.address = node.address;
  remote.not_asked = true;
  remote.error = "not asked: " + why;
  return remote;
}

}  // namespace

std::vector<std::vector<RemoteNode>> ask_nodes(const std::vector<NodeToAsk>& nodes, size_t jobs,
                                               std::chrono::steady_clock::time_point until, const AskNode& ask) {
  std::vector<std::vector<RemoteNode>> remotes(jobs);
  for (size_t first = 0; first < nodes.size(); first += kParallelAsks) {
    const size_t end = std::min(nodes.size(), first + kParallelAsks);
    if (std::chrono::steady_clock::now() >= until) {
      for (size_t p = first; p < nodes.size(); ++p) {
        remotes[nodes[p].job].push_back(not_asked(nodes[p], "the view's time to answer ran out first"));
      }
      break;
    }
    std::vector<std::optional<std::future<RemoteNode>>> wave;
    for (size_t p = first; p < end; ++p) {
      try {
        wave.emplace_back(std::async(std::launch::async, [&ask, &node = nodes[p]] {
          try {
            return ask(node);
          } catch (const std::exception& e) {  // the view answers for every node, whatever one call does
            RemoteNode remote;
            remote.node = node.node;
            remote.address = node.address;
            remote.unreachable = true;
            remote.error = std::string("asking it failed: ") + e.what();
            return remote;
          }
        }));
      } catch (const std::exception&) {  // std::system_error, std::bad_alloc
        wave.emplace_back(std::nullopt);  // no thread to ask with: unknown, not unreachable
      }
    }
    for (size_t p = first; p < end; ++p) {
      auto& call = wave[p - first];
      remotes[nodes[p].job].push_back(call ? call->get() : not_asked(nodes[p], "this daemon could not start a thread"));
    }
  }
  return remotes;
}

}  // namespace gradsync::admin
