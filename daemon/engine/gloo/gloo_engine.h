// The Gloo engine: one Gloo context among the nodes of one process group, over TCP (or
// ibverbs when configured), rendezvoused through the peer service.
//
// Allreduce algorithm rule: buffers under 256 KiB use bcube (log-depth, latency-bound sizes);
// larger ones use ring (bandwidth-optimal). Both run the same combine function, ours, so the
// integer and half-precision semantics are gradsync's, not Gloo's defaults.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "daemon/engine/engine.h"
#include "daemon/peer/peer_client.h"

namespace gradsync {

inline constexpr size_t kBcubeBelowBytes = 256 << 10;

struct GlooEngineOptions {
  std::shared_ptr<PeerClient> rendezvous;  // the job's node-0 peer service
  std::string job;
  std::string prefix;                      // key scope: job generation and group
  int node = 0;
  int nodes = 1;
  std::chrono::milliseconds timeout{30'000};
  std::string transport = "tcp";           // "tcp" or "ibverbs"
  std::string hostname = "127.0.0.1";      // tcp: address to bind and advertise
  std::string iface;                       // tcp: interface to bind instead of hostname
  std::string ib_device;                   // ibverbs: device name, e.g. mlx5_0
  int ib_port = 1;
  int ib_index = 0;
};

// Connects the full mesh; blocks up to the timeout. Throws Error (kPeerLost, kTimeout, ...)
// naming the job and the group when the mesh cannot form.
std::unique_ptr<CollectiveEngine> make_gloo_engine(const GlooEngineOptions& options);

}  // namespace gradsync
