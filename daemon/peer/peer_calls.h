// The calls a daemon's peer service received, by method, since it started: the rendezvous
// traffic of formation, failure notices and probes (gradsync_peer_calls_total), and the bytes
// of the values its Get calls answered (gradsync_peer_get_bytes_total). Any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradsync {

class PeerCallCounts {
 public:
  static constexpr std::array<std::string_view, 6> kMethods = {"Set", "Get", "Add", "DeleteJob", "Ping", "Progress"};

  void add(std::string_view method) {
    for (size_t i = 0; i < kMethods.size(); ++i) {
      if (kMethods[i] == method) {
        counts_[i].fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
  }
  void add_get_bytes(uint64_t bytes) { get_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t get_bytes() const { return get_bytes_.load(std::memory_order_relaxed); }

  std::vector<std::pair<std::string, uint64_t>> snapshot() const {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (size_t i = 0; i < kMethods.size(); ++i) {
      out.emplace_back(std::string(kMethods[i]), counts_[i].load(std::memory_order_relaxed));
    }
    return out;
  }

 private:
  std::array<std::atomic<uint64_t>, kMethods.size()> counts_{};
  std::atomic<uint64_t> get_bytes_{0};
};

}  // namespace gradsync
