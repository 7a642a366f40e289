// HostCollectiveEngine: the collective, on host memory, among the daemons of the nodes that host
// one process group: the cross-node stage of a host set's hierarchical operation (local reduce
// -> engine -> local fan-out). gloo/ implements it.
//
// gradsync has two engine interfaces, named as two, because their contracts differ: this one
// takes one host buffer per call and answers each call when it finished; its sibling
// DeviceCollectiveEngine (device_engine.h, implemented by nccl/) takes one device buffer per
// local GPU, enqueues on CUDA streams, and reports completion separately (watch()). A single
// interface would have every caller branch on which half it may use. gradsync never implements
// its own network collective: engines wrap existing ones, and only the engine factory
// (factory.cc) names them.
//
// Contract:
//   - Calls are asynchronous: each returns at once and its Done runs exactly once, on a thread
//     of the engine, when the call finished, failed or was aborted. Calls run in the order they
//     were made (every node makes the same calls in the same order).
//   - A reduction takes a gradsync reduction (ReduceSpec), not a callback, so an engine can map
//     it to its library's own operations (NCCL) or build the combine itself (Gloo).
//   - abort() may be called from any thread: the call in flight fails promptly (well within a
//     second, not at the engine's timeout) and every later call fails with the same reason.
//   - Foreign errors are translated once, inside the implementation. After the first error the
//     engine is unusable and every later call fails with that error.
//   - An engine keeps each call's Done, and whatever it captures, until its library has left
//     the call, even when it answered the call earlier (an abort answers a call whose library
//     thread may still be inside it: the Gloo engine waits at most 500 ms). Callers capture
//     the owners of the call's buffers in Done, so that such a thread never writes into memory
//     that was freed, unmapped or handed to the next call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <span>

#include "daemon/reduce/kernel.h"
#include "shared/dtype.h"
#include "shared/status.h"

namespace gradsync {

// A reduction as the engine carries it. The buffer holds elements of
// reduce::accumulation_dtype(element); with wide_accumulate off, half types round to their own
// precision after every combine, as the one-node kernel does.
struct ReduceSpec {
  reduce::Combine op = reduce::Combine::kSum;
  DType element = DType::kFloat32;  // the tensors' dtype
  bool wide_accumulate = true;
  // Wire compression: the buffer holds float16 or bfloat16 (not the accumulation type), and
  // every combine widens to float32 and rounds back (reduce::wire_combiner). Unset: none.
  std::optional<DType> wire;
};

using EngineDone = std::function<void(const Status&)>;

// The host path cuts an allreduce larger than this into engine calls of this size and overlaps
// each call with the local stages of the next and previous slices (host/cross_node.h). Each Gloo
// call has a fixed cost (its ring fills and drains: about 3 ms at 16 MiB on loopback, measured),
// and the overlap pays only where cores are left over from the network, so the default is
// large; README "Across nodes: slice size and algorithm" has the measurements.
inline constexpr uint64_t kDefaultSliceBytes = 64ull << 20;

class HostCollectiveEngine {
 public:
  virtual ~HostCollectiveEngine() = default;  // aborts what is in flight, then waits for it

  virtual int node() const = 0;   // this daemon's index among the group's nodes
  virtual int nodes() const = 0;  // how many nodes the group spans
  // The size of the slices a large allreduce is carried in (see kDefaultSliceBytes).
  virtual uint64_t slice_bytes() const { return kDefaultSliceBytes; }

  // In place over `count` accumulation-type elements.
  virtual void allreduce(void* data, size_t count, const ReduceSpec& spec, EngineDone done) = 0;

  // In place; on the root node `data` is the input, elsewhere the output.
  virtual void broadcast(void* data, size_t bytes, int root_node, EngineDone done) = 0;

  // Every node contributes `bytes`; `out` receives nodes() * bytes, node-major.
  virtual void allgather(const void* in, size_t bytes, void* out, EngineDone done) = 0;

  // In place; the result is meaningful on the root node only.
  virtual void reduce(void* data, size_t count, const ReduceSpec& spec, int root_node, EngineDone done) = 0;

  // In place over nodes() consecutive parts of `data`, part n holding counts[n] elements (of the
  // wire type, else the accumulation type), node-major: when Done runs, this node's part holds
  // the reduction of every node's copy of it, combined in node order (node 0's, then node 1's
  // combined into it, ...); the other parts are left as they were. Every node passes the same
  // counts. Each node sends every other node only that node's part, and receives nodes() - 1
  // copies of its own: with equal parts (nodes() - 1) / nodes() of the buffer each way, half of
  // what a ring allreduce moves; with one large part, its node receives that many times it.
  virtual void reduce_scatter(void* data, std::span<const uint64_t> counts, const ReduceSpec& spec,
                              EngineDone done) = 0;

  // Fails the call in flight and every later one with `why`. Any thread; idempotent; never
  // blocks (the answer to the call in flight may come a little later, on another thread).
  virtual void abort(const Status& why) = 0;
};

// Runs one engine call and waits for its Done: for callers that have nothing else to do
// meanwhile. Bounded because every engine call is (by its timeout, or by abort()). `owners`
// (the call's buffers' owners) rides in the Done, so the engine holds it until its library has
// left the call.
Status run_engine_call(const std::function<void(EngineDone)>& call, std::shared_ptr<const void> owners = nullptr);

}  // namespace gradsync
