#include "gradsync/sparse.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <optional>

#include "client/src/client_impl.h"
#include "shared/half.h"

namespace gradsync {
namespace {

// Values are summed in float64 for float64 and float32 otherwise (the half types' rounding
// happens once, at the end, as in the dense reductions).
double load(DType dtype, const std::byte* at) {
  switch (dtype) {
    case DType::kFloat64: { double v; std::memcpy(&v, at, 8); return v; }
    case DType::kFloat16: { uint16_t v; std::memcpy(&v, at, 2); return half_to_float(v); }
    case DType::kBFloat16: { uint16_t v; std::memcpy(&v, at, 2); return bfloat16_to_float(v); }
    default: { float v; std::memcpy(&v, at, 4); return v; }
  }
}

void store(DType dtype, double value, std::byte* at) {
  switch (dtype) {
    case DType::kFloat64: std::memcpy(at, &value, 8); return;
    case DType::kFloat16: { const uint16_t v = float_to_half(static_cast<float>(value)); std::memcpy(at, &v, 2); return; }
    case DType::kBFloat16: { const uint16_t v = float_to_bfloat16(static_cast<float>(value)); std::memcpy(at, &v, 2); return; }
    default: { const float v = static_cast<float>(value); std::memcpy(at, &v, 4); return; }
  }
}

// acc += x in the accumulation type: float32 for all but float64.
double add(DType dtype, double acc, double x) {
  return dtype == DType::kFloat64 ? acc + x : static_cast<double>(static_cast<float>(acc) + static_cast<float>(x));
}

double divide(DType dtype, double acc, double divisor) {
  return dtype == DType::kFloat64 ? acc / divisor : static_cast<double>(static_cast<float>(acc) / static_cast<float>(divisor));
}

// One gathered entry: row `index`, from the rank at `source`, its k-th.
struct Entry {
  int64_t index = 0;
  size_t source = 0;
  uint64_t k = 0;
};

// Sums the rows of `entries` (sorted by index, stably: sources, then their own order, for equal
// indices) into `out`: coalesced (indices and rows) or dense (every row), each value
// accumulated from zero in the accumulation type and divided by `divisor` when given.
void sum_rows(const SparseSpec& spec, const std::vector<Entry>& entries, const std::vector<const std::byte*>& values,
              bool dense, const std::optional<double>& divisor, SparseReduced* out) {
  const size_t element = dtype_size(spec.dtype), width = spec.row_elements;
  if (dense) out->values.assign(spec.rows * width * element, std::byte{0});
  std::vector<double> row(width);
  for (size_t i = 0; i < entries.size();) {
    const int64_t index = entries[i].index;
    std::fill(row.begin(), row.end(), 0.0);
    for (; i < entries.size() && entries[i].index == index; ++i) {
      const std::byte* from = values[entries[i].source] + entries[i].k * width * element;
      for (size_t e = 0; e < width; ++e) row[e] = add(spec.dtype, row[e], load(spec.dtype, from + e * element));
    }
    std::byte* into;
    if (dense) {
      into = out->values.data() + static_cast<uint64_t>(index) * width * element;
    } else {
      out->indices.push_back(index);
      out->values.resize(out->indices.size() * width * element);
      into = out->values.data() + (out->indices.size() - 1) * width * element;
    }
    for (size_t e = 0; e < width; ++e) {
      store(spec.dtype, divisor ? divide(spec.dtype, row[e], *divisor) : row[e], into + e * element);
    }
  }
}

// Why this rank's entries of tensor t cannot be sent; empty when they can.
std::string refusal(const SparseSpec& spec, const SparseEntries& entries, size_t t) {
  if (!entries.indices.empty() && entries.values == nullptr) {
    return "tensor " + std::to_string(t) + " has indices but no values";
  }
  for (size_t k = 0; k < entries.indices.size(); ++k) {
    const int64_t index = entries.indices[k];
    if (index < 0 || static_cast<uint64_t>(index) >= spec.rows) {
      return "tensor " + std::to_string(t) + " entry " + std::to_string(k) + " has index " + std::to_string(index) +
             ", outside its " + std::to_string(spec.rows) + " rows";
    }
  }
  return {};
}

}  // namespace

SparseReducer::SparseReducer(Client& client, std::vector<SparseSpec> specs, SparseOptions options)
    : client_(client), specs_(std::move(specs)), options_(std::move(options)), world_(client.world_size()) {
  if (specs_.empty()) throw Error(Status::invalid_argument("sparse: no tensors"));
  if (world_ <= 0) throw Error(Status::invalid_argument("sparse: join a job before making a SparseReducer"));
  if (options_.label.size() > 100) {
    throw Error(Status::invalid_argument("sparse: the label is " + std::to_string(options_.label.size()) +
                                         " bytes; at most 100 (the sets' labels add a suffix to it)"));
  }
  for (size_t t = 0; t < specs_.size(); ++t) {
    if (!dtype_is_floating(specs_[t].dtype)) {
      throw Error(Status::invalid_argument("sparse: tensor " + std::to_string(t) + " is " +
                                           std::string(dtype_name(specs_[t].dtype)) +
                                           "; sparse reduction takes floating-point values"));
    }
    if (specs_[t].rows == 0 || specs_[t].row_elements == 0) {
      throw Error(Status::invalid_argument("sparse: tensor " + std::to_string(t) + " has " +
                                           std::to_string(specs_[t].rows) + " rows of " +
                                           std::to_string(specs_[t].row_elements) + " elements"));
    }
  }
  counts_ = {client_.allocate(TensorSpec{DType::kInt64, specs_.size(), "dp"})};
  counts_set_ = client_.register_tensors(counts_, RegisterOptions{.allgather = true, .label = options_.label + " (counts)"});
}

std::vector<SparseEntries> SparseReducer::on_host(std::span<const SparseEntries> given, std::vector<HostCopy>* copies,
                                                  std::string* refused) {
  std::vector<SparseEntries> entries(given.begin(), given.end());
  copies->resize(given.size());
  for (size_t t = 0; t < given.size(); ++t) {
    const SparseEntries& from = given[t];
    if (from.device < 0) continue;
    if (!from.indices.empty() && from.values == nullptr) continue;  // refusal() names it
    // The client library's own Client is the only one that reaches the GPU; a stand-in would
    // have no way to read device memory.
    auto* reader = dynamic_cast<ClientImpl*>(&client_);
    const size_t value_bytes = from.indices.size() * specs_[t].row_elements * dtype_size(specs_[t].dtype);
    HostCopy& copy = (*copies)[t];
    copy.indices.resize(from.indices.size());
    copy.values.resize(value_bytes);
    Status read = reader ? reader->copy_to_host(from.device, copy.indices.data(), from.indices.data(),
                                                from.indices.size() * sizeof(int64_t))
                         : Status::not_supported("this Client cannot read device memory");
    if (read.ok() && reader) read = reader->copy_to_host(from.device, copy.values.data(), from.values, value_bytes);
    if (!read.ok()) {
      *refused = "tensor " + std::to_string(t) + "'s entries on device " + std::to_string(from.device) +
                 " could not be read: " + read.message();
      return entries;
    }
    entries[t] = SparseEntries{copy.indices, copy.values.data(), -1};
  }
  return entries;
}

SparseReducer::DataSet& SparseReducer::data_set(const std::vector<uint64_t>& capacity) {
  auto it = data_.find(capacity);
  if (it != data_.end()) return it->second;
  std::vector<TensorSpec> layout;
  for (size_t t = 0; t < specs_.size(); ++t) layout.push_back({DType::kInt64, capacity[t], "dp"});
  for (size_t t = 0; t < specs_.size(); ++t) {
    layout.push_back({specs_[t].dtype, capacity[t] * specs_[t].row_elements, "dp"});
  }
  DataSet made;
  made.tensors = client_.allocate_flat(layout);
  made.set = client_.register_tensors(made.tensors, RegisterOptions{.allgather = true,
                                                                    .label = options_.label + " (entries)"});
  return data_.emplace(capacity, std::move(made)).first->second;
}

std::vector<SparseReduced> SparseReducer::allreduce(std::span<const SparseEntries> entries,
                                                    const ReduceOptions& options, std::chrono::milliseconds timeout) {
  // What every rank refuses alike (the same call on every rank) is refused before anything is
  // sent, and leaves the reducer usable.
  const size_t n = specs_.size();
  if (!broken_.empty()) throw Error(Status::aborted("sparse: this reducer failed earlier (" + broken_ + "); make a new one"));
  if (entries.size() != n) {
    throw Error(Status::invalid_argument("sparse: " + std::to_string(entries.size()) + " tensors' entries for a reducer of " +
                                         std::to_string(n)));
  }
  if (options.op != ReduceOp::kSum && options.op != ReduceOp::kAvg) {
    throw Error(Status::invalid_argument("sparse: tensors are reduced with kSum or kAvg only"));
  }
  if (options.op == ReduceOp::kAvg && options.scaling == Scaling::kBefore) {
    throw Error(Status::invalid_argument("sparse: kAvg divides after summing; Scaling::kBefore is not offered"));
  }
  if (options.health || options.wire_dtype || !options.fp32_accumulate) {
    throw Error(Status::invalid_argument("sparse: health, wire_dtype and fp32_accumulate = false are not offered"));
  }
  if (options.op == ReduceOp::kSum && options.divisor != 0) {
    throw Error(Status::invalid_argument("sparse: a divisor applies only to kAvg"));
  }
  if (!(options.divisor >= 0) || !std::isfinite(options.divisor)) {
    throw Error(Status::invalid_argument("sparse: the divisor must be positive and finite (0: the world size), got " +
                                         std::to_string(options.divisor)));
  }
  try {
    return exchange(entries, options, timeout.count() > 0 ? timeout : client_.job_timeout() + std::chrono::seconds(5));
  } catch (const Error& e) {
    broken_ = e.what();
    throw;
  }
}

std::vector<SparseReduced> SparseReducer::exchange(std::span<const SparseEntries> given, const ReduceOptions& options,
                                                   std::chrono::milliseconds timeout) {
  const size_t n = specs_.size();
  // This rank's entries, its repeated rows summed (rounded to the dtype), unless it refuses
  // them: then it still takes part, sending -1, so that every rank fails alike. Device entries
  // are read to the host first; a copy that fails is a refusal too.
  std::string refused;
  std::vector<HostCopy> copies;
  const std::vector<SparseEntries> entries = on_host(given, &copies, &refused);
  std::vector<SparseReduced> local(n);
  for (size_t t = 0; t < n && refused.empty(); ++t) refused = refusal(specs_[t], entries[t], t);
  if (refused.empty()) {
    for (size_t t = 0; t < n; ++t) {
      std::vector<Entry> own;
      for (uint64_t k = 0; k < entries[t].indices.size(); ++k) own.push_back(Entry{entries[t].indices[k], 0, k});
      std::stable_sort(own.begin(), own.end(), [](const Entry& a, const Entry& b) { return a.index < b.index; });
      sum_rows(specs_[t], own, {static_cast<const std::byte*>(entries[t].values)}, false, std::nullopt, &local[t]);
    }
  }
  // 1. Every rank's counts.
  const std::span<int64_t> mine = counts_[0].as<int64_t>();
  for (size_t t = 0; t < n; ++t) mine[t] = refused.empty() ? static_cast<int64_t>(local[t].indices.size()) : -1;
  if (!client_.allgather(counts_set_).wait(timeout)) {
    throw Error(Status::timeout("sparse: the entry counts were not gathered within " + std::to_string(timeout.count()) + " ms"));
  }
  if (!refused.empty()) throw Error(Status::invalid_argument("sparse: " + refused));
  std::vector<std::vector<uint64_t>> counts(static_cast<size_t>(world_), std::vector<uint64_t>(n));
  std::vector<uint64_t> largest(n, 0);
  for (int r = 0; r < world_; ++r) {
    const std::span<const int64_t> theirs = counts_set_.gathered(r, 0).as<const int64_t>();
    for (size_t t = 0; t < n; ++t) {
      if (theirs[t] < 0 || static_cast<uint64_t>(theirs[t]) > specs_[t].rows) {
        throw Error(Status::invalid_argument("sparse: rank " + std::to_string(r) +
                                             " refused its entries for this call (its own error names why)"));
      }
      counts[static_cast<size_t>(r)][t] = static_cast<uint64_t>(theirs[t]);
      largest[t] = std::max(largest[t], counts[static_cast<size_t>(r)][t]);
    }
  }
  // 2. Every rank's entries, in the smallest set registered so far that holds them (every rank
  // registered the same ones), else in a new one grown to a power of two.
  const std::vector<uint64_t>* fits = nullptr;
  uint64_t fits_elements = 0;
  for (const auto& [capacity, made] : data_) {
    bool holds = true;
    uint64_t elements = 0;
    for (size_t t = 0; t < n; ++t) {
      holds &= capacity[t] >= largest[t];
      elements += capacity[t] * (1 + specs_[t].row_elements);
    }
    if (holds && (!fits || elements < fits_elements)) {
      fits = &capacity;
      fits_elements = elements;
    }
  }
  std::vector<uint64_t> capacity(n);
  for (size_t t = 0; t < n; ++t) {
    capacity[t] = 1;
    while (capacity[t] < largest[t]) capacity[t] *= 2;
    capacity[t] = std::min(capacity[t], specs_[t].rows);
  }
  DataSet& data = data_set(fits ? *fits : capacity);
  for (size_t t = 0; t < n; ++t) {
    std::memcpy(data.tensors[t].data(), local[t].indices.data(), local[t].indices.size() * sizeof(int64_t));
    std::memcpy(data.tensors[n + t].data(), local[t].values.data(), local[t].values.size());
  }
  if (!client_.allgather(data.set).wait(timeout)) {
    throw Error(Status::timeout("sparse: the entries were not gathered within " + std::to_string(timeout.count()) + " ms"));
  }
  // 3. The sum, in rank order for equal indices.
  const std::optional<double> divisor =
      options.op == ReduceOp::kAvg ? std::optional<double>(options.divisor != 0 ? options.divisor : world_) : std::nullopt;
  std::vector<SparseReduced> out(n);
  for (size_t t = 0; t < n; ++t) {
    std::vector<Entry> all;
    std::vector<const std::byte*> values(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) {
      const size_t source = static_cast<size_t>(r);
      const int64_t* indices = data.set.gathered(r, t).as<const int64_t>().data();
      values[source] = data.set.gathered(r, n + t).data();
      for (uint64_t k = 0; k < counts[source][t]; ++k) {
        if (indices[k] < 0 || static_cast<uint64_t>(indices[k]) >= specs_[t].rows) {
          throw Error(Status::protocol("sparse: rank " + std::to_string(r) + " sent index " + std::to_string(indices[k]) +
                                       " for tensor " + std::to_string(t)));
        }
        all.push_back(Entry{indices[k], source, k});
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) { return a.index < b.index; });
    sum_rows(specs_[t], all, values, options_.result == SparseResult::kDense, divisor, &out[t]);
  }
  return out;
}

}  // namespace gradsync
