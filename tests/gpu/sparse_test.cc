// Sparse (COO) entries in device memory through gradsync::SparseReducer, from C++: real client
// processes on one GPU, the real daemon. Each rank writes its entries to the GPU on a stream of
// its own, behind a kernel-free delay (a host-to-device copy of a large buffer queued first),
// and hands the reducer that stream: the copy to the host must wait for it. The results are
// checked against an independent sum of every rank's entries (values are quarters, exact in
// float32 and float16), and against the same reducer fed the host copies.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <vector>

#include "gradsync/sparse.h"
#include "shared/half.h"
#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

constexpr std::chrono::seconds kCaseBound{25};

const std::vector<SparseSpec> kSpecs = {{DType::kFloat32, 1000, 8}, {DType::kFloat16, 64, 1}};

struct Made {
  std::vector<int64_t> indices;
  std::vector<double> values;  // indices.size() x row_elements
};

// Rank r's entries of tensor t: repeats included (row 3 twice), different counts per rank.
Made entries_of(int rank, size_t t) {
  Made m;
  const uint64_t count = 5 + static_cast<uint64_t>(rank) * 4 + t;
  for (uint64_t k = 0; k < count; ++k) {
    m.indices.push_back(k < 2 ? 3 : static_cast<int64_t>((k * 37 + static_cast<uint64_t>(rank) * 11) % kSpecs[t].rows));
    for (uint64_t e = 0; e < kSpecs[t].row_elements; ++e) {
      m.values.push_back(static_cast<double>(static_cast<int64_t>((k * 13 + e * 5 + static_cast<uint64_t>(rank)) % 17) - 8) / 4);
    }
  }
  return m;
}

std::vector<std::byte> bytes_of(DType dtype, const std::vector<double>& values) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat16) {
      const uint16_t v = float_to_half(static_cast<float>(values[i]));
      std::memcpy(out.data() + i * 2, &v, 2);
    } else {
      const float v = static_cast<float>(values[i]);
      std::memcpy(out.data() + i * 4, &v, 4);
    }
  }
  return out;
}

// Device memory freed when it goes.
struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&data, bytes == 0 ? 1 : bytes) != cudaSuccess) data = nullptr;
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

int rank_body(const std::string& socket, const std::string& job, int rank, int world) {
  auto client = join(socket, job, rank, world);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return fail("cudaStreamCreate failed");
  // Something slow queued ahead of the entries on the same stream: 256 MiB from pageable
  // memory would be synchronous, so from pinned memory, asynchronously.
  constexpr size_t kDelayBytes = size_t{256} << 20;
  void* pinned = nullptr;
  if (cudaMallocHost(&pinned, kDelayBytes) != cudaSuccess) return fail("cudaMallocHost failed");
  DeviceBuffer delay(kDelayBytes);
  std::vector<Made> made;
  std::vector<std::vector<std::byte>> host_values;
  std::vector<std::unique_ptr<DeviceBuffer>> device_indices, device_values;
  std::vector<SparseEntries> on_device, on_host;
  if (cudaMemcpyAsync(delay.data, pinned, kDelayBytes, cudaMemcpyHostToDevice, stream) != cudaSuccess) {
    return fail("the delay copy failed");
  }
  for (size_t t = 0; t < kSpecs.size(); ++t) {
    made.push_back(entries_of(rank, t));
    host_values.push_back(bytes_of(kSpecs[t].dtype, made[t].values));
    device_indices.push_back(std::make_unique<DeviceBuffer>(made[t].indices.size() * sizeof(int64_t)));
    device_values.push_back(std::make_unique<DeviceBuffer>(host_values[t].size()));
    if (!device_indices[t]->data || !device_values[t]->data) return fail("cudaMalloc failed");
    // From pageable memory the copies are staged by the driver: queued behind the delay all the same.
    if (cudaMemcpyAsync(device_indices[t]->data, made[t].indices.data(), made[t].indices.size() * sizeof(int64_t),
                        cudaMemcpyHostToDevice, stream) != cudaSuccess ||
        cudaMemcpyAsync(device_values[t]->data, host_values[t].data(), host_values[t].size(), cudaMemcpyHostToDevice,
                        stream) != cudaSuccess) {
      return fail("copying the entries to the device failed");
    }
    on_device.push_back(SparseEntries{{static_cast<const int64_t*>(device_indices[t]->data), made[t].indices.size()},
                                      device_values[t]->data, 0});
    on_host.push_back(SparseEntries{made[t].indices, host_values[t].data(), -1});
  }
  client->set_stream(stream);
  SparseReducer reducer(*client, kSpecs, SparseOptions{});
  const std::vector<SparseReduced> from_device = reducer.allreduce(on_device, ReduceOptions{ReduceOp::kSum});
  const std::vector<SparseReduced> from_host = reducer.allreduce(on_host, ReduceOptions{ReduceOp::kSum});
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);
  for (size_t t = 0; t < kSpecs.size(); ++t) {
    // The reference: every rank's entries summed by row, in double (quarters: exact).
    std::map<int64_t, std::vector<double>> sums;
    for (int r = 0; r < world; ++r) {
      const Made theirs = entries_of(r, t);
      for (size_t k = 0; k < theirs.indices.size(); ++k) {
        std::vector<double>& row = sums[theirs.indices[k]];
        row.resize(kSpecs[t].row_elements);
        for (size_t e = 0; e < row.size(); ++e) row[e] += theirs.values[k * row.size() + e];
      }
    }
    std::vector<int64_t> want_indices;
    std::vector<double> want_values;
    for (const auto& [index, row] : sums) {
      want_indices.push_back(index);
      want_values.insert(want_values.end(), row.begin(), row.end());
    }
    const std::string what = "tensor " + std::to_string(t) + " rank " + std::to_string(rank);
    if (from_device[t].indices != want_indices) return fail(what + ": the indices differ from the reference");
    if (from_device[t].values != bytes_of(kSpecs[t].dtype, want_values)) return fail(what + ": the values differ");
    if (from_device[t].indices != from_host[t].indices || from_device[t].values != from_host[t].values) {
      return fail(what + ": device entries summed differently from the same entries on the host");
    }
  }
  return kOk;
}

}  // namespace

TEST_CASE("gpu end to end: sparse entries in device memory, read after the client's stream, sum like host ones",
          "[gpu][e2e][sparse]") {
  TestDaemon daemon;
  const std::string job = unique_job("gpu-sparse");
  ClientGroup group(2, [&](int rank) { return rank_body(daemon.socket(), job, rank, 2); });
  for (int status : group.wait_all(kCaseBound)) CHECK(exit_code(status) == kOk);
}

}  // namespace gradsync::test
