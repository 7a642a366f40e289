// Sparse (COO) gradients across ranks, as an embedding table makes them (the seeds' S16 S35
// S36): each rank has, per tensor, some entries (a row index and that row's values), different
// in number from rank to rank and step to step. A sum of them is their union, so nothing is
// reduced in place: every rank's entries are gathered through the daemon, in two allgathers
// of sets in the client's memory, and each rank sums what it gathered.
//   1. every rank's entry count per tensor (one int64 each);
//   2. every rank's entries: all tensors' indices (int64) and all tensors' values flattened
//      separately, each padded to the tensor's capacity, the largest count any rank had so far
//      rounded up to a power of two. Every rank saw the same counts, so every rank grows a
//      capacity (and registers the larger set) alike; one set per capacity is kept.
// The sum runs in rank order, then each rank's own order, in float32 for the half types (the
// dtype itself otherwise), rounding once: every rank gets the same bits. Python's
// gradsync.torch.sparse speaks the same two operations.
//
//   gradsync::SparseReducer reducer(*client, {{DType::kFloat32, 50'000, 64}}, {});
//   auto sums = reducer.allreduce({{indices, values}}, {ReduceOp::kAvg});  // collective, blocking
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gradsync/client.h"

namespace gradsync {

// One sparse tensor's shape: `rows` rows (an embedding's vocabulary) of `row_elements` values.
struct SparseSpec {
  DType dtype = DType::kFloat32;  // a floating-point dtype
  uint64_t rows = 0;
  uint64_t row_elements = 1;
};

// A rank's entries of one tensor: indices[k] is the row of values[k * row_elements ...].
// Indices may repeat (an uncoalesced tensor); each must be below the spec's rows.
struct SparseEntries {
  std::span<const int64_t> indices;
  const void* values = nullptr;  // indices.size() * row_elements elements of the spec's dtype
};

enum class SparseResult {
  kCoalesced,  // sorted unique indices and their summed rows
  kDense,      // rows x row_elements values, zero where no rank had an entry
};

struct SparseOptions {
  SparseResult result = SparseResult::kCoalesced;
  // The ranks taking part, as the group "dp" or a group declared at join with these ranks
  // (sorted); `world_size` for "dp". Every one of them calls allreduce alike.
  std::string group = "dp";
  std::vector<int> ranks;
  int world_size = 0;
  std::string label = "sparse gradients";  // names the reducer's sets in messages
};

// One tensor's result: for kCoalesced, `indices` (sorted, unique) and their rows in `values`;
// for kDense, `values` holds all rows x row_elements and `indices` is empty. Values are of
// the spec's dtype, as bytes.
struct SparseReduced {
  std::vector<int64_t> indices;
  std::vector<std::byte> values;
};

class SparseReducer {
 public:
  // Checks the specs and options (throws Error naming what is wrong); registers nothing yet.
  SparseReducer(Client& client, std::vector<SparseSpec> specs, SparseOptions options);

  // Collective across the group: sums (kSum) or averages (kAvg: by `divisor`, or the group's
  // size) every rank's entries, one result per tensor. Blocks until done or `timeout` (then
  // throws Error(Timeout)). Other ops are refused: a missing entry is a zero, for which min
  // and max mean little.
  std::vector<SparseReduced> allreduce(std::span<const SparseEntries> entries, const ReduceOptions& options,
                                       std::chrono::milliseconds timeout = std::chrono::minutes(5));

 private:
  // The entries' set for one capacity vector: indices then values, packed, with allgather.
  struct DataSet {
    std::vector<SharedTensor> tensors;
    TensorSet set;
  };
  DataSet& data_set(const std::vector<uint64_t>& capacity);

  Client& client_;
  std::vector<SparseSpec> specs_;
  SparseOptions options_;
  std::vector<SharedTensor> counts_;  // one int64 per tensor
  TensorSet counts_set_;
  bool registered_counts_ = false;
  std::vector<uint64_t> capacity_;  // grown, never shrunk
  std::map<std::vector<uint64_t>, DataSet> data_;
};

}  // namespace gradsync
