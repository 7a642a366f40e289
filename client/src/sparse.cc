#include "gradsync/sparse.h"

#include <algorithm>
#include <cstring>
#include <numeric>

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

uint64_t grown(uint64_t have, uint64_t need) {
  uint64_t size = std::max<uint64_t>(have, 1);
  while (size < need) size *= 2;
  return size;
}

// One gathered entry: row `index`, from the rank at `source` (in group order), its k-th.
struct Entry {
  int64_t index = 0;
  size_t source = 0;
  uint64_t k = 0;
};

}  // namespace

SparseReducer::SparseReducer(Client& client, std::vector<SparseSpec> specs, SparseOptions options)
    : client_(client), specs_(std::move(specs)), options_(std::move(options)) {
  if (specs_.empty()) throw Error(Status::invalid_argument("sparse: no tensors"));
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
  if (options_.ranks.empty()) {
    if (options_.group != "dp" || options_.world_size <= 0) {
      throw Error(Status::invalid_argument("sparse: give the group's ranks (SparseOptions::ranks), or world_size for "
                                           "\"dp\""));
    }
    options_.ranks.resize(static_cast<size_t>(options_.world_size));
    std::iota(options_.ranks.begin(), options_.ranks.end(), 0);
  }
  capacity_.assign(specs_.size(), 1);
}

SparseReducer::DataSet& SparseReducer::data_set(const std::vector<uint64_t>& capacity) {
  auto it = data_.find(capacity);
  if (it != data_.end()) return it->second;
  std::vector<TensorSpec> layout;
  for (size_t t = 0; t < specs_.size(); ++t) layout.push_back({DType::kInt64, capacity[t], options_.group});
  for (size_t t = 0; t < specs_.size(); ++t) {
    layout.push_back({specs_[t].dtype, capacity[t] * specs_[t].row_elements, options_.group});
  }
  DataSet made;
  made.tensors = client_.allocate_flat(layout);
  made.set = client_.register_tensors(made.tensors, RegisterOptions{.allgather = true,
                                                                    .label = options_.label + " (entries)"});
  return data_.emplace(capacity, std::move(made)).first->second;
}

std::vector<SparseReduced> SparseReducer::allreduce(std::span<const SparseEntries> entries,
                                                    const ReduceOptions& options, std::chrono::milliseconds timeout) {
  const size_t n = specs_.size();
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
  for (size_t t = 0; t < n; ++t) {
    for (size_t k = 0; k < entries[t].indices.size(); ++k) {
      const int64_t index = entries[t].indices[k];
      if (index < 0 || static_cast<uint64_t>(index) >= specs_[t].rows) {
        throw Error(Status::invalid_argument("sparse: tensor " + std::to_string(t) + " entry " + std::to_string(k) +
                                             " has index " + std::to_string(index) + ", outside its " +
                                             std::to_string(specs_[t].rows) + " rows"));
      }
    }
    if (!entries[t].indices.empty() && entries[t].values == nullptr) {
      throw Error(Status::invalid_argument("sparse: tensor " + std::to_string(t) + " has indices but no values"));
    }
  }
  if (!registered_counts_) {
    counts_ = {client_.allocate(TensorSpec{DType::kInt64, n, options_.group})};
    counts_set_ = client_.register_tensors(counts_, RegisterOptions{.allgather = true, .label = options_.label + " (counts)"});
    registered_counts_ = true;
  }
  // 1. Every rank's counts.
  const std::span<int64_t> mine = counts_[0].as<int64_t>();
  for (size_t t = 0; t < n; ++t) mine[t] = static_cast<int64_t>(entries[t].indices.size());
  if (!client_.allgather(counts_set_).wait(timeout)) {
    throw Error(Status::timeout("sparse: the entry counts were not gathered within " + std::to_string(timeout.count()) + " ms"));
  }
  std::vector<std::vector<uint64_t>> counts(options_.ranks.size(), std::vector<uint64_t>(n));
  for (size_t r = 0; r < options_.ranks.size(); ++r) {
    const std::span<const int64_t> theirs = counts_set_.gathered(options_.ranks[r], 0).as<const int64_t>();
    for (size_t t = 0; t < n; ++t) {
      if (theirs[t] < 0) throw Error(Status::protocol("sparse: rank " + std::to_string(options_.ranks[r]) + " sent a negative count"));
      counts[r][t] = static_cast<uint64_t>(theirs[t]);
      capacity_[t] = grown(capacity_[t], counts[r][t]);
    }
  }
  // 2. Every rank's entries, padded to the capacity every rank computed alike.
  DataSet& data = data_set(capacity_);
  for (size_t t = 0; t < n; ++t) {
    const size_t bytes = dtype_size(specs_[t].dtype) * specs_[t].row_elements;
    std::memcpy(data.tensors[t].data(), entries[t].indices.data(), entries[t].indices.size() * sizeof(int64_t));
    if (!entries[t].indices.empty()) std::memcpy(data.tensors[n + t].data(), entries[t].values, entries[t].indices.size() * bytes);
  }
  if (!client_.allgather(data.set).wait(timeout)) {
    throw Error(Status::timeout("sparse: the entries were not gathered within " + std::to_string(timeout.count()) + " ms"));
  }
  // 3. The sum, in rank order and each rank's own order for equal indices.
  const double divisor = options.op == ReduceOp::kAvg
                             ? (options.divisor != 0 ? options.divisor : static_cast<double>(options_.ranks.size()))
                             : 1.0;
  std::vector<SparseReduced> out(n);
  for (size_t t = 0; t < n; ++t) {
    const SparseSpec& spec = specs_[t];
    const size_t element = dtype_size(spec.dtype), width = spec.row_elements;
    std::vector<Entry> all;
    std::vector<const int64_t*> indices(options_.ranks.size());
    std::vector<const std::byte*> values(options_.ranks.size());
    for (size_t r = 0; r < options_.ranks.size(); ++r) {
      indices[r] = data.set.gathered(options_.ranks[r], t).as<const int64_t>().data();
      values[r] = data.set.gathered(options_.ranks[r], n + t).data();
      for (uint64_t k = 0; k < counts[r][t]; ++k) {
        if (indices[r][k] < 0 || static_cast<uint64_t>(indices[r][k]) >= spec.rows) {
          throw Error(Status::protocol("sparse: rank " + std::to_string(options_.ranks[r]) + " sent index " +
                                       std::to_string(indices[r][k]) + " for tensor " + std::to_string(t)));
        }
        all.push_back(Entry{indices[r][k], r, k});
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) { return a.index < b.index; });
    const bool dense = options_.result == SparseResult::kDense;
    if (dense) out[t].values.assign(spec.rows * width * element, std::byte{0});
    std::vector<double> row(width);
    for (size_t i = 0; i < all.size();) {
      const int64_t index = all[i].index;
      std::fill(row.begin(), row.end(), 0.0);
      for (; i < all.size() && all[i].index == index; ++i) {
        const std::byte* from = values[all[i].source] + all[i].k * width * element;
        for (size_t e = 0; e < width; ++e) row[e] = add(spec.dtype, row[e], load(spec.dtype, from + e * element));
      }
      std::byte* into;
      if (dense) {
        into = out[t].values.data() + static_cast<uint64_t>(index) * width * element;
      } else {
        out[t].indices.push_back(index);
        out[t].values.resize(out[t].indices.size() * width * element);
        into = out[t].values.data() + (out[t].indices.size() - 1) * width * element;
      }
      for (size_t e = 0; e < width; ++e) {
        store(spec.dtype, options.op == ReduceOp::kAvg ? divide(spec.dtype, row[e], divisor) : row[e], into + e * element);
      }
    }
  }
  return out;
}

}  // namespace gradsync
