// Sparse (COO) gradients across ranks, as an embedding table makes them (the seeds' S16 S35
// S36): each rank has, per tensor, some entries (a row index and that row's values), different
// in number from rank to rank and step to step. A sum of them is their union, so nothing is
// reduced in place: each rank first sums its own repeated rows (so a tensor never has more
// entries than rows), then every rank's entries are gathered through the daemon, in two
// allgathers of sets in the client's memory, and each rank sums what it gathered.
//   1. every rank's entry count per tensor (one int64 each; -1 when the rank refused its input,
//      so that every rank fails the call alike rather than fall a step apart);
//   2. every rank's entries: all tensors' indices (int64) and all tensors' values flattened
//      separately, each padded to the tensor's capacity: the smallest one registered so far
//      that holds this call's largest count, else that count rounded up to a power of two (at
//      most the rows). Every rank saw the same counts, so every rank picks (and registers) the
//      same set.
// The sums run in rank order, then row order, in float32 for the half types (the dtype itself
// otherwise), rounding each rank's own sum and the total once each: every rank gets the same
// bits. Python's gradsync.torch.sparse speaks the same two operations. Over the whole job
// only ("dp"): a named group's non-members would see no counts and pick other sets.
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
// Entries in CUDA device memory (an embedding's gradient on the GPU) name their device: they
// are copied to the host after the work queued so far on the client's stream (set_stream), and
// the call waits for the copy, so the caller may reuse them once it returns. The exchange and
// the sums then run on the host as for host entries, and the results are host memory.
struct SparseEntries {
  std::span<const int64_t> indices;
  const void* values = nullptr;  // indices.size() * row_elements elements of the spec's dtype
  int device = -1;               // -1: host memory; else the CUDA device (this process's ordinal)
};

enum class SparseResult {
  kCoalesced,  // sorted unique indices and their summed rows
  kDense,      // rows x row_elements values, zero where no rank had an entry
};

struct SparseOptions {
  SparseResult result = SparseResult::kCoalesced;
  std::string label = "sparse gradients";  // names the reducer's sets in messages (<= 100 bytes)
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
  // Checks the specs and options (throws Error naming what is wrong) and registers the counts'
  // set: a registration, so every rank of the job makes its reducers alike, in the same order
  // as its other sets. A reducer belongs to the job incarnation it was made in.
  SparseReducer(Client& client, std::vector<SparseSpec> specs, SparseOptions options);

  // Collective across every rank of the job: sums (kSum) or averages (kAvg: by `divisor`, or
  // the world size, after summing) every rank's entries, one result per tensor. Blocks until
  // done or `timeout` (zero: the job's timeout and 5 s more), then throws Error(Timeout). A
  // rank's bad input (an index outside the rows, values missing) fails the call on every rank,
  // naming that rank. Other ops, prescale, health, wire compression and fp32_accumulate = false
  // are refused: a missing entry is a zero, for which min and max mean little. After an error
  // the reducer refuses further calls (an exchange may still be in flight): make a new one on
  // every rank.
  std::vector<SparseReduced> allreduce(std::span<const SparseEntries> entries, const ReduceOptions& options,
                                       std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

 private:
  // The entries' set for one capacity vector: indices then values, packed, with allgather.
  struct DataSet {
    std::vector<SharedTensor> tensors;
    TensorSet set;
  };
  DataSet& data_set(const std::vector<uint64_t>& capacity);

  // Entries in device memory, read to the host; `given` as it is when all are host entries.
  struct HostCopy {
    std::vector<int64_t> indices;
    std::vector<std::byte> values;
  };
  std::vector<SparseEntries> on_host(std::span<const SparseEntries> given, std::vector<HostCopy>* copies,
                                     std::string* refused);

  std::vector<SparseReduced> exchange(std::span<const SparseEntries> entries, const ReduceOptions& options,
                                      std::chrono::milliseconds timeout);

  Client& client_;
  std::vector<SparseSpec> specs_;
  SparseOptions options_;
  int world_ = 0;
  std::vector<SharedTensor> counts_;  // one int64 per tensor
  TensorSet counts_set_;
  std::map<std::vector<uint64_t>, DataSet> data_;  // by capacity
  std::string broken_;  // why the reducer refuses further calls; empty while it works
};

}  // namespace gradsync
