#include "daemon/engine/gloo/store.h"

#include "daemon/engine/gloo/address_scrub.h"

#include <algorithm>

namespace gradsync {
namespace {

// The most a family fetch asks the rendezvous for in one reply, and a Gloo TCP address's size
// (gloo/transport/tcp/address.h: a sockaddr_storage and a sequence number).
constexpr size_t kReplyBytes = 1 << 20;
constexpr size_t kAddressBytes = 136;

}  // namespace

PeerStore::PeerStore(std::shared_ptr<RendezvousStore> client, std::string job, std::string prefix,
                     std::chrono::milliseconds timeout, bool tcp_addresses, int ranks)
    : client_(std::move(client)),
      job_(std::move(job)),
      prefix_(std::move(prefix)),
      timeout_(timeout),
      tcp_addresses_(tcp_addresses),
      ranks_(ranks) {}

std::optional<std::string> PeerStore::family_of(const std::string& key) const {
  if (ranks_ <= 0) return std::nullopt;
  for (const std::string family : {"", "rank_"}) {
    if (key.size() <= family.size() || key.compare(0, family.size(), family) != 0) continue;
    const std::string number = key.substr(family.size());
    if (number.size() > 9 || number.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoi(number) < ranks_) return family;
  }
  return std::nullopt;
}

void PeerStore::fetch_family(const std::string& family, std::chrono::milliseconds timeout) {
  // A rank's "<r>" value holds an address (136 bytes in Gloo's TCP transport) for every other
  // rank: a whole family is N² addresses, past gRPC's 4 MiB reply limit at about 170 ranks. So
  // the keys go in batches of about kReplyBytes each; a batch still waits for all its keys.
  const size_t value_bytes = family.empty() ? kAddressBytes * static_cast<size_t>(ranks_) + 64 : 256;
  const size_t batch = std::max<size_t>(1, kReplyBytes / value_bytes);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int first = 0; first < ranks_; first += static_cast<int>(batch)) {
    const int end = std::min(ranks_, first + static_cast<int>(batch));
    std::vector<std::string> keys, values;
    for (int r = first; r < end; ++r) keys.push_back(prefix_ + family + std::to_string(r));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    throw_if_error(client_->get(job_, keys, std::max(left, std::chrono::milliseconds(1)), &values));
    for (int r = first; r < end; ++r) fetched_[family + std::to_string(r)] = values[static_cast<size_t>(r - first)];
  }
}

void PeerStore::set(const std::string& key, const std::vector<char>& data) {
  std::vector<char> value = data;
  // Gloo publishes its pair addresses under the rank's number ("rank_N" holds the hostname).
  if (tcp_addresses_ && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
      !gloo_engine::scrub_tcp_addresses(&value)) {
    // Not the layout this Gloo was built with: publishing it could leak the daemon's memory.
    throw Error(Status::internal("Gloo published " + std::to_string(value.size()) + " bytes under key " + key +
                                 " that are not TCP addresses of the layout gradsync scrubs (a different Gloo?); "
                                 "refusing to publish them"));
  }
  throw_if_error(client_->set(job_, prefix_ + key, std::string(value.begin(), value.end()), timeout_));
}

std::vector<char> PeerStore::get(const std::string& key) {
  if (const auto family = family_of(key)) {
    if (!fetched_.count(key)) fetch_family(*family, timeout_);
    const std::string& value = fetched_.at(key);
    return std::vector<char>(value.begin(), value.end());
  }
  std::vector<std::string> values;
  throw_if_error(client_->get(job_, {prefix_ + key}, timeout_, &values));
  return std::vector<char>(values[0].begin(), values[0].end());
}

void PeerStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void PeerStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  if (!keys.empty() && std::all_of(keys.begin(), keys.end(), [this](const std::string& k) { return family_of(k).has_value(); })) {
    for (const auto& key : keys) {
      if (!fetched_.count(key)) fetch_family(*family_of(key), timeout);
    }
    return;
  }
  std::vector<std::string> scoped;
  for (const auto& key : keys) scoped.push_back(prefix_ + key);
  std::vector<std::string> values;
  throw_if_error(client_->get(job_, scoped, timeout, &values));
}

}  // namespace gradsync
