// The operation kinds of a device bucket whose group spans GPUs (this node's and others'), one
// planner each over the executor's shared skeleton (CudaExecutor::run_across): the skeleton
// readies every local GPU, uploads the tables the planner asks for, waits for the clients'
// ready events, gathers, has the planner enqueue the collective, scatters, records the done
// events and hands the GPUs' events to the engine's watchdog. A planner says only what differs
// by kind: which gather and scatter each GPU makes around the collective, which tables they
// use, and the collective itself. One file each, as Gloo keeps one algorithm a file:
// across_allreduce.cc, across_reduce.cc, across_broadcast.cc, across_allgather.cc,
// across_reduce_scatter.cc.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "daemon/backend/executor.h"
#include "daemon/engine/device_engine.h"
#include "daemon/reduce/kernel.h"
#include "shared/status.h"

namespace gradsync::cuda {

// Which side of a bucket a table serves. kScatterGathered: a copy from the bucket buffer into
// every participant's allgather output, at the slot of one source rank (the table's `only`).
// kScatterShards: each participant on the GPU gets its reduce-scatter shard's part of the
// bucket (TensorSet::shard_pieces) in its shard output: one destination per piece, so the
// table has one "client" whatever the number of participants. kWire: the whole bucket buffer
// against the table's own buffer of the wire dtype (wire compression): a scatter with the wire
// dtype's arithmetic narrows the float32 sums into it, a gather of its one "client" widens them
// back.
enum class Side { kGather, kScatter, kScatterGathered, kScatterShards, kWire };

// Which launches a bucket makes on one GPU around its collective.
struct Launches {
  int only = -1;          // gather from this local rank only (a broadcast's root)
  bool gather = true;
  bool bytes = false;     // moves bytes (broadcast, allgather) rather than reducing values
  int scatter_only = -1;  // scatter to this local rank only (a reduce's root)
  bool scatter_skips_root = false;
  bool scatter = true;
  bool scatter_shards = false;  // scatter each participant's shard (reduce-scatter), not the tensors
};

// One table a GPU's launches use, uploaded before anything of the bucket is queued.
struct TableRequest {
  Side side = Side::kGather;
  int only = -1;
  bool skip_root = false;
  bool bytes = false;
};

// The bucket as the skeleton prepared it for the planner.
struct AcrossBucket {
  const BucketCall* call = nullptr;
  DeviceCollectiveEngine* engine = nullptr;
  DType dtype = DType::kFloat32;
  size_t count = 0;          // elements
  size_t bytes = 0;          // of the buffer each GPU gives the collective
  reduce::KernelArgs args;   // of the gather and scatter kernels
  // The operation's root (reduce, broadcast): its node, its local rank there, its rank among
  // the engine's GPUs, and its GPU when it is on this node (else -1).
  int root_node = 0;
  int root_local = 0;
  int root_rank = -1;
  int root_gpu = -1;
  bool root_here = false;
  bool direct = false;  // zero-copy: the buffers are the clients' own flat runs
  // Wire compression (ReduceOptions::wire_dtype): the buffers the collective gets hold this half
  // type, narrowed from the float32 sums and widened after; unset: none.
  std::optional<DType> wire;
};

// The executor's steps that a collective interleaves with its own calls (allgather's, source
// by source), on the executor's thread.
class AcrossSteps {
 public:
  virtual Status make_current(int device) = 0;
  // The source's tensors into the bucket buffer of its GPU (a local rank on `device`).
  virtual Status gather_from(int device, int source_local) = 0;
  // The bucket buffer into every local participant's output on `device`, at `source_rank`'s slot.
  virtual Status scatter_gathered(int device, int source_rank) = 0;
  // The GPU of a local client's tensors of the bucket, or -1.
  virtual int device_of_client(uint32_t local_rank) const = 0;

 protected:
  ~AcrossSteps() = default;
};

class AcrossPlanner {
 public:
  virtual ~AcrossPlanner() = default;
  // The collective moves the tensors' bytes as they are (broadcast, allgather) rather than
  // reducing values in the accumulation type: the kernels copy as uint8.
  virtual bool moves_bytes() const { return false; }
  // The operation has a root, which must have a GPU in the group.
  virtual bool has_root() const { return false; }
  // The operation may run zero-copy in the clients' own flat runs (CudaExecutor::zero_copy).
  virtual bool zero_copy() const { return false; }
  // Elements of the buffer each GPU gives the collective; by default the bucket's.
  virtual size_t buffer_elements(const AcrossBucket& bucket) const { return bucket.count; }
  // The gather before and the scatter after the collective on `device`.
  virtual Launches launches(const AcrossBucket& bucket, int device) const = 0;
  // The tables `device`'s launches use; by default those of launches().
  virtual std::vector<TableRequest> tables(const AcrossBucket& bucket, int device, AcrossSteps& steps) const;
  // Enqueues the collective on every local GPU's buffer (in devices() order).
  virtual Status collective(const AcrossBucket& bucket, std::span<const DeviceBuffer> buffers,
                            AcrossSteps& steps) const = 0;
};

// The planner of `kind`; they hold no state.
const AcrossPlanner& across_planner(OpKind kind);
const AcrossPlanner& allreduce_across();
const AcrossPlanner& reduce_across();
const AcrossPlanner& broadcast_across();
const AcrossPlanner& allgather_across();
const AcrossPlanner& reduce_scatter_across();

}  // namespace gradsync::cuda
