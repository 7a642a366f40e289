#include "daemon/peer/peer_channels.h"

#include <algorithm>

namespace gradsync {

grpc::ChannelArguments PeerChannels::arguments() {
  grpc::ChannelArguments args;
  // Retry a failed connection after 100 ms, then at most every second (gRPC's default grows
  // to 2 minutes, during which a restarted peer would look gone).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC 1.51 also takes this as the bound on one connection attempt, handshake included:
  // 5 s rather than its default 20 s, so an attempt stuck on a frozen peer is given up and
  // made again once the peer is back.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  // A channel nobody calls for a minute goes idle: it stops reconnecting to a peer that is gone
  // (every second, with the backoff above) until the next call.
  args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, 60'000);
  return args;
}

std::shared_ptr<grpc::Channel> PeerChannels::get(const std::string& address,
                                                 const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  MutexLock lock(mutex_);
  auto it = channels_.find(address);
  if (it == channels_.end()) {
    if (channels_.size() >= max_) {
      channels_.erase(std::min_element(channels_.begin(), channels_.end(), [](const auto& a, const auto& b) {
        return a.second.used < b.second.used;
      }));
    }
    it = channels_.emplace(address, Entry{grpc::CreateCustomChannel(address, credentials, arguments_), 0}).first;
  }
  it->second.used = ++clock_;
  return it->second.channel;
}

size_t PeerChannels::size() const {
  MutexLock lock(mutex_);
  return channels_.size();
}

}  // namespace gradsync
