// DeviceCollectiveEngine: the collective among every GPU of one process group of a job, for
// sets in device memory (nccl/ is the implementation; the engine factory makes it). The second
// of gradsync's two engine interfaces; host_engine.h says why there are two. One engine
// spans all the GPUs of the group on every node; this daemon drives its local GPUs' ranks.
// Clients that share a GPU are combined by the CUDA executor's kernels first, so each GPU is one
// rank (NCCL refuses two ranks on one GPU).
//
// Contract:
//   - connect() agrees on ranks and ids with the other nodes through a Rendezvous and creates
//     the communicators. It blocks up to the engine's timeout; abort() ends it promptly.
//   - The collectives enqueue: they return once the work is queued on the streams given (after
//     whatever those streams already hold), not when it ran. They take one buffer per local GPU,
//     in devices() order, and are issued from one thread.
//   - watch() reports when enqueued work finished: `done` runs exactly once, on the engine's
//     watchdog thread, when poll says so, or with the error that failed the engine (an
//     asynchronous NCCL error, the timeout, abort()). The engine aborts its communicators before
//     it answers an error, so the GPUs no longer touch the buffers once `done` ran.
//   - abort() may be called from any thread, never blocks, and is sticky. It aborts the
//     communicators when work may be in flight on them or when they span other nodes; idle,
//     healthy ones of this node alone are left as they are, so that the engine can keep them
//     for the job's next generation when it goes (a restarted trainer re-joining: nccl/park.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/engine/host_engine.h"
#include "daemon/engine/rendezvous.h"
#include "shared/status.h"

namespace gradsync {

// One local GPU's part of a collective.
struct DeviceBuffer {
  int device = -1;
  void* data = nullptr;
  void* stream = nullptr;  // the daemon's stream on that device (cudaStream_t)
  // Out of place: the collective reads its input here and writes `data`; null: in place.
  // (NCCL treats an in-place collective of a single rank as a no-op.)
  const void* source = nullptr;
};

class DeviceCollectiveEngine {
 public:
  virtual ~DeviceCollectiveEngine() = default;  // aborts what is in flight (see watch())

  virtual Status connect(Rendezvous* rendezvous) = 0;
  // After connect(): whether it took communicators kept from the job's previous generation
  // rather than creating them.
  virtual bool reused() const = 0;
  // After connect(): whether its communicators were split off spec.parent's.
  virtual bool split() const { return false; }
  // Whether another engine of the job may be split off this one now (DeviceEngineSpec::parent):
  // it connected, is healthy, and has a communicator spanning the group.
  virtual bool splittable() const { return false; }

  // After connect(): how many GPUs the group has in all, this node's in rank order, and the
  // rank of the GPU that holds a given rank's tensors (-1 when that rank takes no part).
  virtual int ranks() const = 0;
  virtual std::span<const int> devices() const = 0;
  virtual int rank_of(int node, int local_rank) const = 0;

  // `count` elements of reduce::accumulation_dtype(spec.element), or of spec.wire when set (wire
  // compression: the buffers hold the half type, which NCCL reduces), into each buffer's data,
  // from its source (or in place). reduce() alike; reduce_scatter() never gets a wire type.
  virtual Status allreduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& spec) = 0;
  // Root's buffer is the input (its source, or its data).
  virtual Status broadcast(std::span<const DeviceBuffer> buffers, size_t bytes, int root) = 0;
  // As allreduce; the result is meaningful on root's buffer only.
  virtual Status reduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& spec, int root) = 0;
  // Each rank's `bytes` of `in` land at rank * bytes in every `out`.
  virtual Status allgather(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t bytes) = 0;
  // `in` holds ranks() * count elements; rank r's `out` gets the r-th `count` of the reduction.
  virtual Status reduce_scatter(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t count,
                                const ReduceSpec& spec) = 0;

  // Registers a buffer of the daemon's with the communicator of `device` for zero-copy
  // (ncclCommRegister), once; *registered says whether the library took it.
  virtual Status register_buffer(int device, void* data, size_t bytes, bool* registered) = 0;
  // Undoes register_buffer(device, data) (ncclCommDeregister), so that the memory may be
  // unmapped; a buffer never registered (or refused) is only forgotten. The caller guarantees
  // that no collective queued on the engine still uses it. An error leaves the registration in
  // place: the memory must then stay mapped as long as the engine lives.
  virtual Status deregister_buffer(int device, void* data) = 0;

  virtual void watch(std::string what, std::function<Status(bool* done)> poll, std::chrono::milliseconds timeout,
                     EngineDone done) = 0;

  virtual void abort(const Status& why) = 0;

  // For an owner that gave its GPU work up for lost (it may still run, waiting on a client's
  // event): stop watching; communicators with a collective queued are left as they are, never
  // freed (idle ones are aborted); the owner leaks the engine itself too. Nothing may be
  // watched.
  virtual void abandon() = 0;
};

// What one device engine connects: one group of one set of a job. Every node uses the same name.
struct DeviceEngineSpec {
  std::string what;  // "job J group G", for messages
  std::string name;  // the exchange name, e.g. "nccl/set3/g0"
  // For each local rank: the index of its GPU among `devices`, or -1 when it takes no part.
  std::vector<int> slot_of_local_rank;
  std::vector<int> devices;  // this node's GPUs of the group (ordinals), without repeats
  std::chrono::milliseconds timeout{30'000};
  // How long issuing one collective may wait for NCCL to take it. NCCL connects a communicator's
  // peers lazily, at its first collective of each kind (NCCL_RUNTIME_CONNECT, the default), and
  // that waits for every peer to issue the same collective: a peer late in its backward pass
  // holds it as long as the execution bound lets it be late. So it is bounded as the bucket is:
  // the execution bound plus the job timeout.
  std::chrono::milliseconds enqueue_timeout{630'000};
  // Names the job and the engine the same way in every generation of the job, so that idle
  // communicators can be kept for its next one; empty: never kept. Every node sets it alike.
  std::string reuse_key;
  // Split the communicators off this engine's (ncclCommSplit, sharing its resources) instead of
  // making fresh ones. Set only when every node named the same parent and it holds every GPU of
  // this node's here; the parent belongs to the same job and outlives connect(). Null: fresh.
  DeviceCollectiveEngine* parent = nullptr;
  // Create a communicator even when the group has one GPU in all (which the executor does alone):
  // for GPU tests and benchmarks on a machine with one GPU.
  bool single_rank_communicator = false;
};

class DeviceEngineFactory {
 public:
  virtual ~DeviceEngineFactory() = default;
  // An engine not connected yet, so that its owner can abort the connect.
  virtual Status make(const DeviceEngineSpec& spec, std::unique_ptr<DeviceCollectiveEngine>* out) = 0;
};

}  // namespace gradsync
