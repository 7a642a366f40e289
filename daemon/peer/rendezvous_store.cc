#include "daemon/peer/rendezvous_store.h"

namespace gradsync {

Status RendezvousStore::peek(const std::string& job, const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout, std::vector<std::optional<std::string>>* values) {
  // One get of each key that answers at once: a store without a batched read (node 0's peer
  // service, whose callers ping it first) pays a call per key.
  values->clear();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    if (std::chrono::steady_clock::now() >= deadline) return Status::timeout(describe() + ": reading " + key + " timed out");
    std::vector<std::string> value;
    if (get(job, {key}, std::chrono::milliseconds(0), &value).ok()) {
      values->push_back(std::move(value[0]));
    } else {
      values->push_back(std::nullopt);
    }
  }
  return Status();
}

}  // namespace gradsync
