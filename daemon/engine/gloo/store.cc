#include "daemon/engine/gloo/store.h"

#include "daemon/engine/gloo/address_scrub.h"

#include <algorithm>

namespace gradsync {
namespace {

// The most a family fetch asks the rendezvous for in one reply, and a Gloo TCP address's size
// (gloo/transport/tcp/address.h: a sockaddr_storage and a sequence number).
constexpr size_t kReplyBytes = 1 << 20;
constexpr size_t kAddressBytes = 136;
// A column that says "read the whole lists" (store.h).
constexpr char kWhole[] = "whole";
// How much longer than its own timeout a rank waits for its column: rank 0 publishes it only
// after every list arrived, one call per rank (as PeerCluster's kTableSlack for node 0's table).
constexpr auto kColumnSlack = std::chrono::milliseconds(2000);

// Where rank `rank`'s entry is in rank r's list of pair addresses (Gloo's extractAddress):
// the list skips r itself.
size_t slot_of(int rank, int r) { return static_cast<size_t>(rank > r ? rank - 1 : rank); }

}  // namespace

PeerStore::PeerStore(std::shared_ptr<RendezvousStore> client, std::string job, std::string prefix,
                     std::chrono::milliseconds timeout, bool tcp_addresses, int ranks, int rank)
    : client_(std::move(client)),
      job_(std::move(job)),
      prefix_(std::move(prefix)),
      timeout_(timeout),
      tcp_addresses_(tcp_addresses),
      ranks_(ranks),
      rank_(rank) {}

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

void PeerStore::fetch_addresses(std::chrono::milliseconds timeout) {
  if (rank_ == 0) {
    // The columns may take half the slack the other ranks give them beyond their own timeout,
    // so that the last list arriving just in time still leaves room to publish.
    const auto deadline = std::chrono::steady_clock::now() + timeout + kColumnSlack / 2;
    fetch_family("", timeout);
    publish_columns(deadline);
    addresses_fetched_ = true;
    return;
  }
  const std::string key = "col_" + std::to_string(rank_);
  std::vector<std::string> values;
  throw_if_error(client_->get(job_, {prefix_ + key}, std::max(timeout, std::chrono::milliseconds(1)) + kColumnSlack,
                              &values));
  const std::string& column = values[0];
  if (column == kWhole) {
    fetch_family("", timeout);
    addresses_fetched_ = true;
    return;
  }
  const size_t others = static_cast<size_t>(ranks_ - 1);
  if (column.empty() || column.size() % others != 0) {
    throw Error(Status::protocol("rank 0 of the Gloo mesh published a column of " + std::to_string(column.size()) +
                                 " bytes for rank " + std::to_string(rank_) + ": not " + std::to_string(others) +
                                 " addresses of one size"));
  }
  const size_t entry = column.size() / others;
  size_t at = 0;
  for (int r = 0; r < ranks_; ++r) {
    if (r == rank_) continue;
    own_entry_[std::to_string(r)] = column.substr(at, entry);
    at += entry;
  }
  addresses_fetched_ = true;
}

void PeerStore::publish_columns(std::chrono::steady_clock::time_point deadline) {
  // Every list must be N - 1 entries of one size for its columns to mean what Gloo reads.
  const size_t others = static_cast<size_t>(ranks_ - 1);
  size_t entry = 0;
  bool columns = others > 0;
  for (int r = 0; r < ranks_ && columns; ++r) {
    const std::string& list = fetched_.at(std::to_string(r));
    columns = !list.empty() && list.size() % others == 0 && (entry == 0 || list.size() / others == entry);
    entry = columns ? list.size() / others : 0;
  }
  for (int s = 1; s < ranks_; ++s) {
    std::string column;
    if (!columns) {
      column = kWhole;
    } else {
      column.reserve(entry * others);
      for (int r = 0; r < ranks_; ++r) {
        if (r != s) column.append(fetched_.at(std::to_string(r)), slot_of(s, r) * entry, entry);
      }
    }
    // One bound for them all: the rest of this rank's wait for the mesh.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    throw_if_error(client_->set(job_, prefix_ + "col_" + std::to_string(s), column,
                                std::max(left, std::chrono::milliseconds(1))));
  }
}

void PeerStore::ensure(const std::string& family, const std::string& key, std::chrono::milliseconds timeout) {
  if (family.empty()) {
    if (!addresses_fetched_) fetch_addresses(timeout);
  } else if (!fetched_.count(key)) {
    fetch_family(family, timeout);
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
    ensure(*family, key, timeout_);
    if (const auto own = own_entry_.find(key); own != own_entry_.end()) {
      // Rank r's list as Gloo reads it: this rank's entry in its slot, the others zero.
      const std::string& entry = own->second;
      std::vector<char> list(entry.size() * static_cast<size_t>(ranks_ - 1), 0);
      std::copy(entry.begin(), entry.end(), list.begin() + static_cast<std::ptrdiff_t>(slot_of(rank_, std::stoi(key)) * entry.size()));
      return list;
    }
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
    for (const auto& key : keys) ensure(*family_of(key), key, timeout);
    return;
  }
  std::vector<std::string> scoped;
  for (const auto& key : keys) scoped.push_back(prefix_ + key);
  std::vector<std::string> values;
  throw_if_error(client_->get(job_, scoped, timeout, &values));
}

}  // namespace gradsync
