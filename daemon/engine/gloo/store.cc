#include "daemon/engine/gloo/store.h"

namespace gradsync {

PeerStore::PeerStore(std::shared_ptr<PeerClient> client, std::string job, std::string prefix,
                     std::chrono::milliseconds timeout)
    : client_(std::move(client)), job_(std::move(job)), prefix_(std::move(prefix)), timeout_(timeout) {}

void PeerStore::set(const std::string& key, const std::vector<char>& data) {
  throw_if_error(client_->set(job_, prefix_ + key, std::string(data.begin(), data.end()), timeout_));
}

std::vector<char> PeerStore::get(const std::string& key) {
  std::vector<std::string> values;
  throw_if_error(client_->get(job_, {prefix_ + key}, timeout_, &values));
  return std::vector<char>(values[0].begin(), values[0].end());
}

void PeerStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void PeerStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> scoped;
  for (const auto& key : keys) scoped.push_back(prefix_ + key);
  std::vector<std::string> values;
  throw_if_error(client_->get(job_, scoped, timeout, &values));
}

}  // namespace gradsync
