// The gather and scatter kernels on the device against the host reduction: the same cases as
// the host functor tests (tests/unit/cuda_functors_test.cc), now through real launches, so a
// difference between what nvcc and the host compiler make of the functors shows here.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "daemon/backend/cuda/kernels.h"
#include "daemon/backend/cuda/work_items.h"
#include "daemon/reduce/simd.h"
#include "daemon/reduce/staged.h"
#include "tests/unit/reduce_cases.h"

namespace gradsync::cuda {
namespace {

using reduce::KernelArgs;
using reduce::cases::Bytes;

// The largest spans many work items and blocks; filling the inputs on the host is most of the
// test's time, so it is kept at 2^18 + 1 elements.
constexpr uint64_t kSizes[] = {64, kItemElements, 2 * kItemElements + 3, 1, 7, 33, kItemElements + 5, (1 << 18) + 1};

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

// Device memory freed when the test leaves the scope.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { CUDA_OK(cudaMalloc(&data, bytes)); }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* data = nullptr;
};

std::string run_case(const KernelArgs& args, uint32_t clients, size_t skew, std::mt19937_64& rng) {
  const size_t element = dtype_size(args.dtype);
  const size_t acc_element = dtype_size(reduce::accumulation_dtype(args.dtype));
  std::vector<size_t> offset;
  size_t at = 0;
  for (uint64_t size : kSizes) {
    at = (at + 255) / 256 * 256 + skew;
    offset.push_back(at);
    at += size * element;
  }
  const size_t client_bytes = at + 256;
  std::vector<Bytes> host(clients, Bytes(client_bytes));
  for (Bytes& b : host) reduce::cases::fill_random(args.dtype, b, client_bytes / element, reduce::cases::Nans::kExcluded, rng);
  std::vector<std::unique_ptr<DeviceBuffer>> device;
  for (const Bytes& b : host) {
    device.push_back(std::make_unique<DeviceBuffer>(client_bytes));
    CUDA_OK(cudaMemcpy(device.back()->data, b.data(), client_bytes, cudaMemcpyHostToDevice));
  }
  std::vector<Segment> segments;
  uint64_t total = 0;
  for (size_t t = 0; t < std::size(kSizes); ++t) {
    Segment s;
    s.bucket_offset = total;
    s.count = kSizes[t];
    for (uint32_t c = 0; c < clients; ++c) s.address[c] = device[c]->data + offset[t];
    segments.push_back(s);
    total += kSizes[t];
  }
  const std::vector<WorkItem> items = cut_into_items(segments);
  DeviceBuffer acc(total * acc_element), table_segments(segments.size() * sizeof(Segment)),
      table_items(items.size() * sizeof(WorkItem));
  CUDA_OK(cudaMemcpy(table_segments.data, segments.data(), segments.size() * sizeof(Segment), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(table_items.data, items.data(), items.size() * sizeof(WorkItem), cudaMemcpyHostToDevice));
  const BucketTable table{reinterpret_cast<const Segment*>(table_segments.data),
                          reinterpret_cast<const WorkItem*>(table_items.data), items.size(), clients, acc.data};
  REQUIRE(launch_gather(args, table, nullptr).ok());
  REQUIRE(launch_scatter(args, table, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  for (size_t t = 0; t < std::size(kSizes); ++t) {
    std::vector<const void*> inputs;
    for (uint32_t c = 0; c < clients; ++c) inputs.push_back(host[c].data() + offset[t]);
    Bytes want(kSizes[t] * element);
    void* const out = want.data();
    reduce::reduce(args, inputs, std::span<void* const>(&out, 1), kSizes[t]);
    for (uint32_t c = 0; c < clients; ++c) {
      Bytes got(kSizes[t] * element);
      CUDA_OK(cudaMemcpy(got.data(), device[c]->data + offset[t], got.size(), cudaMemcpyDeviceToHost));
      // A sum's NaNs compare as NaNs: the GPU's default NaN is not the host's (see
      // first_difference_any_nan); min and max pick an operand's bits on both, so exactly.
      const std::string difference = args.combine == reduce::Combine::kSum
                                         ? reduce::cases::first_difference_any_nan(got, want, args.dtype)
                                         : reduce::cases::first_difference(got, want, element);
      if (!difference.empty()) return "client " + std::to_string(c) + " tensor " + std::to_string(t) + ": " + difference;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("gpu: gather and scatter kernels equal reduce(), bit for bit but a NaN's payload", "[gpu][kernels]") {
  std::mt19937_64 rng(20261201);
  for (DType dtype : reduce::cases::kAllDTypes) {
    for (const KernelArgs& args : reduce::cases::valid_args(dtype)) {
      for (uint32_t clients = 1; clients <= 3; ++clients) {
        for (size_t skew : {size_t{0}, dtype_size(dtype)}) {
          INFO(reduce::cases::describe(args) << ", " << clients << " clients, skew " << skew);
          CHECK(run_case(args, clients, skew, rng) == "");
        }
      }
    }
  }
}

// The health kernel (one warp per block) against the host's health of the same bytes: bit for
// bit, but for a NaN sum's payload. Tensors of 1, 4096 and 9005 elements, moderate values and
// random ones (with infs, NaNs and subnormals), every floating dtype.
TEST_CASE("gpu: the health kernel equals the host's health, bit for bit but a NaN's payload", "[gpu][kernels][health]") {
  std::mt19937_64 rng(20261204);
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (reduce::cases::Nans nans : {reduce::cases::Nans::kExcluded, reduce::cases::Nans::kIncluded}) {
      INFO(dtype_name(dtype) << (nans == reduce::cases::Nans::kIncluded ? ", with NaNs" : ""));
      const size_t element = dtype_size(dtype);
      std::vector<HealthItem> items;
      std::vector<Bytes> tensors;
      // Random values with infs and NaNs, then finite random ones (full mantissas), whose sums
      // depend on the order of the additions: that order is what the test checks.
      for (uint64_t numel : {uint64_t{1}, reduce::kHealthBlockElements, uint64_t{9005}}) {
        tensors.emplace_back(numel * element);
        reduce::cases::fill_random(dtype, tensors.back(), numel, nans, rng);
      }
      for (uint64_t numel : {uint64_t{4096}, uint64_t{5000}}) {
        tensors.emplace_back(numel * element);
        std::uniform_real_distribution<double> uniform(-4.0, 4.0);
        for (uint64_t i = 0; i < numel; ++i) test::store_as(dtype, tensors.back().data() + i * element, uniform(rng));
      }
      std::vector<std::unique_ptr<DeviceBuffer>> device;
      std::vector<reduce::HealthBlock> want;
      for (const Bytes& t : tensors) {
        device.push_back(std::make_unique<DeviceBuffer>(t.size()));
        CUDA_OK(cudaMemcpy(device.back()->data, t.data(), t.size(), cudaMemcpyHostToDevice));
        const uint64_t numel = t.size() / element;
        for (uint64_t first = 0; first < numel; first += reduce::kHealthBlockElements) {
          const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(reduce::kHealthBlockElements, numel - first));
          items.push_back(HealthItem{device.back()->data + first * element, items.size(), n});
          want.push_back(reduce::simd::health(dtype, t.data() + first * element, n));
        }
      }
      DeviceBuffer table_items(items.size() * sizeof(HealthItem)), out(items.size() * sizeof(reduce::HealthBlock));
      CUDA_OK(cudaMemcpy(table_items.data, items.data(), items.size() * sizeof(HealthItem), cudaMemcpyHostToDevice));
      REQUIRE(launch_health(dtype,
                            HealthTable{reinterpret_cast<const HealthItem*>(table_items.data), items.size(),
                                        reinterpret_cast<reduce::HealthBlock*>(out.data)},
                            nullptr)
                  .ok());
      std::vector<reduce::HealthBlock> got(items.size());
      CUDA_OK(cudaMemcpy(got.data(), out.data, got.size() * sizeof(reduce::HealthBlock), cudaMemcpyDeviceToHost));
      // The finite blocks' sums differ from a plain in-order sum somewhere (else the order of
      // the additions, which is what this test checks, would go unchecked).
      size_t order_sensitive = 0;
      for (size_t b = 0; b < want.size(); ++b) {
        if (!std::isfinite(want[b].sum_sq)) continue;
        Bytes copy(items[b].count * element);
        CUDA_OK(cudaMemcpy(copy.data(), items[b].data, copy.size(), cudaMemcpyDeviceToHost));
        double plain = 0;
        for (uint32_t i = 0; i < items[b].count; ++i) {
          plain = plain + reduce::simd::health(dtype, copy.data() + i * element, 1).sum_sq;  // x * x
        }
        if (plain != want[b].sum_sq) ++order_sensitive;
      }
      // (A half type's sums of squares are exact in float64, so every order agrees there.)
      if (dtype == DType::kFloat32 || dtype == DType::kFloat64) CHECK(order_sensitive > 0);
      for (size_t b = 0; b < got.size(); ++b) {
        INFO("block " << b << ": got " << got[b].sum_sq << " / " << got[b].nonfinite << ", want " << want[b].sum_sq
                      << " / " << want[b].nonfinite);
        CHECK(got[b].nonfinite == want[b].nonfinite);
        const bool both_nan = std::isnan(got[b].sum_sq) && std::isnan(want[b].sum_sq);
        CHECK((both_nan || std::memcmp(&got[b].sum_sq, &want[b].sum_sq, sizeof(double)) == 0));
      }
    }
  }
}

}  // namespace gradsync::cuda

namespace gradsync::cuda {

// What gradsyncd does for every GPU at start: every gather and scatter kernel loaded, none left
// for a lazy load at a first launch (which may synchronise the context).
TEST_CASE("gpu: every kernel is loaded up front", "[gpu][kernels]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  int loaded = 0;
  const Status status = preload_kernels(&loaded);
  INFO(status.message());
  REQUIRE(status.ok());
  CHECK(loaded == 64);  // the 60 gather and scatter kernels tests/gpu/check_ptx.py counts in the PTX, and 4 health
}

}  // namespace gradsync::cuda
