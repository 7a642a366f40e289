// BucketExecutor: runs one bucket of an operation over memory of one kind, within this node and,
// when the bucket's process group spans nodes, through the group's HostCollectiveEngine. It does the
// whole per-bucket path: gather the local clients' tensors, reduce them, carry the result across
// nodes, scale, and write every destination. Each memory kind has its executor in its backend's
// folder (host/ now, cuda/ with the CUDA backend, with the same file names); only the backend
// factory names them, and the worker sees this interface alone.
//
// Contract:
//   - launch() starts one bucket and returns; `done` runs exactly once when every destination
//     holds its result, or with the error that stopped the bucket. It may run before launch()
//     returns, on the caller's thread (cheap node-local work), or later on a thread of the
//     executor or the engine. The caller launches the next bucket only after `done`.
//   - The call holds the set, so the clients' memory stays mapped until `done`.
//   - abort() may be called from any thread: a bucket in flight fails promptly with `why`
//     (an engine it waits on is aborted by its owner, the job's cluster), and so does every
//     later launch. It never blocks.
//   - admit() prepares a set before its first bucket, on the worker thread, in the same order on
//     every node (device executors create the set's communicators there). It may block up to
//     the job timeout; abort() ends it promptly.
//   - A device executor may answer once the bucket's work is queued in order on the GPU (the
//     clients' streams wait on its done events). quiesce(deadline) says whether nothing
//     launched earlier still touches client memory by the deadline: the worker calls it before
//     it tells clients a job failed, since they may then free or reuse their buffers. The GPU
//     work may wait on a client's ready event that never fires, which nothing can cancel; when
//     quiesce() says false, the executor has already given up its resources for lost (it
//     frees nothing) and the worker must keep the job's memory mapped for good.
//   - The destructor waits for the bucket in flight; abort first to bound that wait.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/backend/timings.h"
#include "daemon/engine/host_engine.h"
#include "daemon/engine/rendezvous.h"
#include "daemon/model/op_desc.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"
#include "daemon/reduce/kernel.h"
#include "shared/status.h"

namespace gradsync {

struct BucketCall {
  uint64_t seq = 0;  // the operation's sequence number, the same on every node
  OpDesc desc;
  std::shared_ptr<const TensorSet> set;
  size_t bucket = 0;
  const Topology* topology = nullptr;  // outlives the call
  // The engine of the bucket's group when the group spans nodes; null when it lives on this
  // node only. It outlives the call.
  HostCollectiveEngine* engine = nullptr;
  reduce::KernelArgs args;  // allreduce and reduce
  // Where the time goes, filled in by executors that measure it before they answer; may be null.
  std::shared_ptr<BucketTimings> timings;
  // desc.health: the set's health blocks (TensorSet::health_block), of which the bucket fills
  // its tensors' before it answers; null otherwise.
  std::shared_ptr<std::vector<reduce::HealthBlock>> health;
};

// The silent-data-corruption check (--integrity-check-every): every `every`th operation (by
// sequence number; 0: never), the nodes of each cross-node bucket of an allreduce or a
// reduce-scatter compare a hash of a sample of their reduced copy, and a node that disagrees
// fails the job, named. `corrupt_at_seq` is a test hook: this node flips a byte of its reduced
// copy of that operation's buckets, as a bad memory bit or a faulty core would.
// `fail_alloc_at_seq`, a test hook of the same path: a reduction task of that operation's
// cross-node buckets throws std::bad_alloc, as memory running out on a pool thread would.
struct IntegrityCheck {
  uint64_t every = 0;
  std::optional<uint64_t> corrupt_at_seq;
  std::optional<uint64_t> fail_alloc_at_seq;
};

using BucketDone = std::function<void(const Status&)>;

// What admit() may need: the job's nodes (a LocalRendezvous for a single-node job) and bounds.
struct SetAdmission {
  std::string job;  // for messages
  Rendezvous* rendezvous = nullptr;
  const Topology* topology = nullptr;
  std::chrono::milliseconds timeout{30'000};  // the job timeout: waiting for peers
  // The bound on one bucket in flight (--execution-timeout-ms); a bucket that spans nodes may
  // also wait up to `timeout` for its peers.
  std::chrono::milliseconds execution_timeout{600'000};
  // The job's identity across its generations: the owner's uid and the job id ("1000.resnet").
  // Names what may be kept for the job's next run (a job id alone is another user's too);
  // empty: nothing is kept.
  std::string owner_job;
};

class BucketExecutor {
 public:
  virtual ~BucketExecutor() = default;

  virtual Status admit(const TensorSet& /*set*/, const SetAdmission& /*admission*/) { return Status(); }

  virtual void launch(BucketCall call, BucketDone done) = 0;

  // The set was released and no operation on it is left: what the executor keeps for it (a
  // device's kernel tables, which engine serves it) can go. Worker thread, between launches.
  virtual void retire_set(uint32_t /*set_id*/) {}

  // Lets go of what finished work no longer needs, where that waits for the device (a released
  // set's NCCL registrations, undone once the GPUs are through its buckets). Worker thread,
  // between launches, when the worker is about to sleep: an idle job still frees. Never blocks.
  virtual void tidy() {}

  // Fails the bucket in flight and every later launch with `why`. Any thread; idempotent.
  virtual void abort(const Status& why) = 0;

  virtual bool quiesce(std::chrono::steady_clock::time_point /*deadline*/) { return true; }
};

}  // namespace gradsync
