// The daemon's gRPC channels to its peers: one per peer address, kept for the daemon's life
// (at most `max` addresses; beyond that the least recently used goes, alive for whoever still
// holds it), and shared by every PeerClient the daemon makes.
//
// Why not a channel per client: a channel dropped while its peer is frozen (connected, but
// never answering the HTTP/2 handshake) leaves its socket open in gRPC 1.51, and never closes
// it, not even after the peer answers again. Each probe of a frozen node leaked one descriptor
// on every other node that way (tests/cluster: test_descriptors). With one channel per peer the
// daemon's connections are bounded by its peers, whatever fails and how often.
//
// What a shared channel changes: after a connection attempt fails, gRPC waits before the next
// one (its reconnect backoff) and fails calls at once meanwhile. The backoff is held between
// 100 ms and 1 s (arguments()), so a peer daemon that comes back is reached within a second.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "shared/mutex.h"

namespace gradsync {

class PeerChannels {
 public:
  explicit PeerChannels(size_t max = 1024, grpc::ChannelArguments arguments = PeerChannels::arguments())
      : max_(max < 1 ? 1 : max), arguments_(std::move(arguments)) {}

  // The channel to `address`, made with `credentials` the first time it is asked for.
  std::shared_ptr<grpc::Channel> get(const std::string& address,
                                     const std::shared_ptr<grpc::ChannelCredentials>& credentials);
  size_t size() const;

  // The channel arguments every peer channel is made with (the reconnect backoff above).
  static grpc::ChannelArguments arguments();

 private:
  struct Entry {
    std::shared_ptr<grpc::Channel> channel;
    uint64_t used = 0;
  };
  const size_t max_;
  const grpc::ChannelArguments arguments_;  // every channel's
  mutable Mutex mutex_;
  std::map<std::string, Entry> channels_ GS_GUARDED_BY(mutex_);
  uint64_t clock_ GS_GUARDED_BY(mutex_) = 0;
};

}  // namespace gradsync
