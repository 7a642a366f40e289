// A collective engine among the daemons of the nodes that host one process group: the
// cross-node stage of a hierarchical operation (local reduce -> engine -> local fan-out).
// gradsync never implements its own network collective; engines wrap existing ones (Gloo here,
// NCCL with the CUDA backend), each in its own subfolder with the same file names.
//
// Every call is bounded by the engine's timeout and returns a Status; foreign exceptions are
// translated once, inside the implementation. After an error the engine is unusable (the job
// has failed) and every later call returns the same error.
#pragma once

#include <cstddef>
#include <functional>

#include "shared/dtype.h"
#include "shared/status.h"

namespace gradsync {

// out[i] = a[i] (+) b[i] for n elements of the engine buffer's type (Gloo's reduce signature).
using CombineFn = std::function<void(void* out, const void* a, const void* b, size_t n)>;

class CollectiveEngine {
 public:
  virtual ~CollectiveEngine() = default;

  virtual int node() const = 0;   // this daemon's index among the group's nodes
  virtual int nodes() const = 0;  // how many nodes the group spans

  // In place over `count` elements of `dtype` (float32, float64, int32, int64 or uint8: the
  // accumulation types).
  virtual Status allreduce(void* data, size_t count, DType dtype, const CombineFn& combine) = 0;

  // In place; on the root node `data` is the input, elsewhere the output.
  virtual Status broadcast(void* data, size_t bytes, int root_node) = 0;

  // Every node contributes `bytes`; `out` receives nodes() * bytes, node-major.
  virtual Status allgather(const void* in, size_t bytes, void* out) = 0;

  // In place; the result is meaningful on the root node only.
  virtual Status reduce(void* data, size_t count, DType dtype, const CombineFn& combine, int root_node) = 0;
};

}  // namespace gradsync
