// The engine factory: the one place that names the concrete engines (gloo/ now, nccl/ with the
// CUDA backend). The daemon builds one from its configuration (transport, interface, ibverbs
// device) and hands it to every job; a job's cluster asks it for one engine per process group
// that spans nodes. Tests pass fakes of the same interface.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "daemon/engine/device_engine.h"
#include "daemon/engine/host_engine.h"
#include "daemon/peer/rendezvous_store.h"
#include "shared/status.h"

namespace gradsync {

// What one engine connects: the nodes of one group of one job generation.
struct EngineSpec {
  std::shared_ptr<RendezvousStore> rendezvous;  // the job's rendezvous store
  std::string job;                              // the job's namespace in the rendezvous store
  std::string prefix;                           // key scope: job generation and group
  int node = 0;                                 // this node's index among the group's nodes
  int nodes = 1;
  std::chrono::milliseconds timeout{30'000};  // bound for waiting on peers
};

class HostEngineFactory {
 public:
  virtual ~HostEngineFactory() = default;
  // Connects the engine; blocks up to spec.timeout. The error names the job and the group.
  virtual Status make(const EngineSpec& spec, std::unique_ptr<HostCollectiveEngine>* out) = 0;
};

// The daemon's transport settings for Gloo.
struct GlooTransport {
  std::string transport = "tcp";       // "tcp" or "ibverbs"
  std::string hostname = "127.0.0.1";  // tcp: address to bind and advertise
  std::string iface;                   // tcp: interface to bind instead of hostname
  std::string ib_device;               // ibverbs: device name, e.g. mlx5_0
  int ib_port = 1;
  int ib_index = 0;
  uint64_t slice_bytes = kDefaultSliceBytes;  // --gloo-slice-bytes (engine.h)
};

std::unique_ptr<HostEngineFactory> make_host_engine_factory(const GlooTransport& gloo);

// The NCCL engines of device sets (nccl/), or null in a build without the CUDA backend. NCCL
// itself is loaded on first use, so a daemon on a node without it still serves host jobs.
// `keep_idle`: how long idle communicators of an ended job are kept for its next generation.
std::unique_ptr<DeviceEngineFactory> make_device_engine_factory(std::chrono::seconds keep_idle);

}  // namespace gradsync
