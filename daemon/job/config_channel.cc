#include "daemon/job/config_channel.h"

#include <algorithm>
#include <charconv>
#include <vector>

namespace gradsync {

ConfigChannel::ConfigChannel(std::shared_ptr<RendezvousStore> store, std::string store_job, std::string prefix,
                             int node, int nodes)
    : client_(std::move(store)), store_job_(std::move(store_job)), prefix_(std::move(prefix)), node_(node), nodes_(nodes) {}

Status ConfigChannel::propose(const std::string& settings, std::chrono::milliseconds timeout, uint64_t* k) {
  int64_t claimed = 0;
  if (Status s = client_->add(store_job_, key("cfg/count"), 1, timeout, &claimed); !s.ok()) return s;
  *k = static_cast<uint64_t>(claimed);
  bool stored = false;
  if (Status s = client_->set_if_absent(store_job_, key("cfg/" + std::to_string(*k)), settings, timeout, &stored);
      !s.ok()) {
    return s;
  }
  if (!stored) {
    return Status::aborted("change " + std::to_string(*k) + " was given up by the nodes before it was published");
  }
  return Status();
}

Status ConfigChannel::claimed(uint64_t k, std::chrono::milliseconds timeout, bool* out) {
  int64_t count = 0;
  if (Status s = client_->add(store_job_, key("cfg/count"), 0, timeout, &count); !s.ok()) return s;
  *out = static_cast<uint64_t>(count) >= k;
  return Status();
}

Status ConfigChannel::give_up(uint64_t k, std::chrono::milliseconds timeout) {
  bool stored = false;
  return client_->set_if_absent(store_job_, key("cfg/" + std::to_string(k)), kSkip, timeout, &stored);
}

Status ConfigChannel::wait(uint64_t k, std::chrono::milliseconds timeout, std::string* settings) {
  std::vector<std::string> values;
  if (Status s = client_->get(store_job_, {key("cfg/" + std::to_string(k))}, timeout, &values); !s.ok()) return s;
  *settings = values.at(0);
  return Status();
}

Status ConfigChannel::offer(uint64_t k, uint64_t first_not_begun, std::chrono::milliseconds timeout) {
  return client_->set(store_job_, key("cfg/" + std::to_string(k) + "/at/" + std::to_string(node_)),
                     std::to_string(first_not_begun), timeout);
}

Status ConfigChannel::agree(uint64_t k, std::chrono::milliseconds timeout, uint64_t* from_seq) {
  std::vector<std::string> keys;
  for (int n = 0; n < nodes_; ++n) keys.push_back(key("cfg/" + std::to_string(k) + "/at/" + std::to_string(n)));
  std::vector<std::string> values;
  if (Status s = client_->get(store_job_, keys, timeout, &values); !s.ok()) {
    if (s.code() != ErrorCode::kTimeout) return s;
    // Which nodes did not offer, in one read (a node whose offer cannot be read counts).
    std::string missing;
    std::vector<std::optional<std::string>> offers;
    if (!client_->peek(store_job_, keys, std::chrono::seconds(1), &offers).ok()) offers.clear();
    for (int n = 0; n < nodes_; ++n) {
      if (static_cast<size_t>(n) >= offers.size() || !offers[static_cast<size_t>(n)]) {
        missing += (missing.empty() ? "node " : ", node ") + std::to_string(n);
      }
    }
    return Status::timeout((missing.empty() ? std::string("some node") : missing) +
                           " did not offer an operation number within " + std::to_string(timeout.count()) + " ms");
  }
  uint64_t largest = 0;
  for (size_t n = 0; n < values.size(); ++n) {
    uint64_t seq = 0;
    const std::string& v = values[n];
    if (auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seq); ec != std::errc() || end != v.data() + v.size()) {
      return Status::protocol("node " + std::to_string(n) + " offered a malformed operation number for change " +
                              std::to_string(k));
    }
    largest = std::max(largest, seq);
  }
  *from_seq = largest;
  return Status();
}

}  // namespace gradsync
