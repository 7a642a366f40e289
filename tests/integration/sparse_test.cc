// Sparse (COO) gradients through gradsync::SparseReducer (client/include/gradsync/sparse.h): real
// client processes gather every rank's entries through the real daemon and sum them. Checked
// against an independent sum of every rank's entries (each process makes them all from seeds),
// every floating dtype, sum and avg, coalesced and dense, entry counts that grow from step to
// step (the capacity grows with them) and a rank without entries; then across 2 nodes. Values
// are quarters, whose sums are exact in every dtype, so the check is bit for bit.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <map>

#include "gradsync/sparse.h"
#include "shared/half.h"
#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

const std::vector<SparseSpec> kSpecs = {{DType::kFloat32, 50, 4}, {DType::kFloat16, 7, 1},
                                        {DType::kBFloat16, 30, 3}, {DType::kFloat64, 20, 2}};

struct Made {
  std::vector<int64_t> indices;
  std::vector<double> values;  // indices.size() x row_elements
};

// Rank r's entries of tensor t at `step`: repeats included; rank 1 has none every third step,
// and no rank has any at step 6.
Made entries_of(int rank, int step, size_t t) {
  Made m;
  const uint64_t count = (rank == 1 && step % 3 == 0) || step == 6
                             ? 0
                             : (static_cast<uint64_t>(rank * 5 + step * 7 + t) % 9) + static_cast<uint64_t>(step) * 3;
  for (uint64_t k = 0; k < count; ++k) {
    m.indices.push_back(static_cast<int64_t>((k * 7 + static_cast<uint64_t>(rank) * 3 + t) % kSpecs[t].rows));
    for (uint64_t e = 0; e < kSpecs[t].row_elements; ++e) {
      m.values.push_back(static_cast<double>(static_cast<int64_t>((k * 13 + e * 5 + static_cast<uint64_t>(rank)) % 17) - 8) / 4);
    }
  }
  return m;
}

void put(DType dtype, double value, std::byte* at) {
  switch (dtype) {
    case DType::kFloat64: std::memcpy(at, &value, 8); break;
    case DType::kFloat16: { const uint16_t v = float_to_half(static_cast<float>(value)); std::memcpy(at, &v, 2); break; }
    case DType::kBFloat16: { const uint16_t v = float_to_bfloat16(static_cast<float>(value)); std::memcpy(at, &v, 2); break; }
    default: { const float v = static_cast<float>(value); std::memcpy(at, &v, 4); break; }
  }
}

std::vector<std::byte> bytes_of(DType dtype, const std::vector<double>& values) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) put(dtype, values[i], out.data() + i * dtype_size(dtype));
  return out;
}

int scenario(const std::string& socket, const std::string& job, int rank, int world, int local, const std::string& rendezvous) {
  auto client = local == world ? join(socket, job, rank, world) : join_nodes(socket, job, rank, world, local, rendezvous);
  for (SparseResult result : {SparseResult::kCoalesced, SparseResult::kDense}) {
    SparseReducer reducer(*client, kSpecs, SparseOptions{.result = result});
    // Averages by 4 stay exact: the world size's default divisor only with 4 ranks.
    std::vector<ReduceOptions> modes = {ReduceOptions{ReduceOp::kSum}, ReduceOptions{ReduceOp::kAvg, Scaling::kAfter, 4.0}};
    if (world == 4) modes.push_back(ReduceOptions{ReduceOp::kAvg});
    for (int step = 0; step < 7; ++step) {
      for (const ReduceOptions& o : modes) {
        std::vector<Made> made;
        std::vector<std::vector<std::byte>> raw;
        std::vector<SparseEntries> entries;
        for (size_t t = 0; t < kSpecs.size(); ++t) {
          made.push_back(entries_of(rank, step, t));
          raw.push_back(bytes_of(kSpecs[t].dtype, made.back().values));
        }
        for (size_t t = 0; t < kSpecs.size(); ++t) entries.push_back({made[t].indices, raw[t].data()});
        const std::vector<SparseReduced> got = reducer.allreduce(entries, o, std::chrono::seconds(60));
        for (size_t t = 0; t < kSpecs.size(); ++t) {
          const SparseSpec& spec = kSpecs[t];
          std::map<int64_t, std::vector<double>> want;
          for (int r = 0; r < world; ++r) {
            const Made theirs = entries_of(r, step, t);
            for (size_t k = 0; k < theirs.indices.size(); ++k) {
              auto& row = want.try_emplace(theirs.indices[k], spec.row_elements, 0.0).first->second;
              for (uint64_t e = 0; e < spec.row_elements; ++e) row[e] += theirs.values[k * spec.row_elements + e];
            }
          }
          const double divisor = o.op == ReduceOp::kAvg ? (o.divisor != 0 ? o.divisor : world) : 1.0;
          std::vector<int64_t> want_indices;
          std::vector<double> want_values;
          if (result == SparseResult::kDense) want_values.assign(spec.rows * spec.row_elements, 0.0);
          for (const auto& [index, row] : want) {
            if (result == SparseResult::kCoalesced) want_indices.push_back(index);
            for (uint64_t e = 0; e < spec.row_elements; ++e) {
              if (result == SparseResult::kDense) {
                want_values[static_cast<uint64_t>(index) * spec.row_elements + e] = row[e] / divisor;
              } else {
                want_values.push_back(row[e] / divisor);
              }
            }
          }
          const std::string what = std::string(result == SparseResult::kDense ? "dense" : "coalesced") + " step " +
                                   std::to_string(step) + " tensor " + std::to_string(t) + " rank " + std::to_string(rank);
          if (got[t].indices != want_indices) return fail(what + ": the indices differ from the reference");
          if (got[t].values != bytes_of(spec.dtype, want_values)) return fail(what + ": the values differ from the reference");
        }
      }
    }
  }
  // One rank's bad input fails the call on every rank, naming that rank; the reducer is then
  // spent, and a new one works.
  SparseReducer reducer(*client, kSpecs, SparseOptions{});
  const std::vector<int64_t> outside = {50};
  const float value[4] = {};
  std::vector<SparseEntries> bad(kSpecs.size());
  if (rank == 1) bad[0] = {outside, value};
  try {
    reducer.allreduce(bad, ReduceOptions{ReduceOp::kSum});
    return fail("an index outside the rows was accepted");
  } catch (const Error& e) {
    const std::string want = rank == 1 ? "entry 0 has index 50, outside its 50 rows" : "rank 1 refused its entries";
    if (std::string(e.what()).find(want) == std::string::npos) return fail(std::string("unexpected error: ") + e.what());
  }
  try {
    reducer.allreduce(std::vector<SparseEntries>(kSpecs.size()), ReduceOptions{ReduceOp::kSum});
    return fail("a failed reducer was used again");
  } catch (const Error& e) {
    if (std::string(e.what()).find("failed earlier") == std::string::npos) return fail(std::string("unexpected: ") + e.what());
  }
  SparseReducer fresh(*client, kSpecs, SparseOptions{});
  const std::vector<int64_t> row = {static_cast<int64_t>(rank)};
  std::vector<SparseEntries> one(kSpecs.size());
  one[0] = {row, value};
  if (fresh.allreduce(one, ReduceOptions{ReduceOp::kSum})[0].indices.size() != static_cast<size_t>(world)) {
    return fail("a new reducer after a failed one did not gather every rank's row");
  }
  try {
    fresh.allreduce(std::vector<SparseEntries>(kSpecs.size()), ReduceOptions{ReduceOp::kMax});
    return fail("a sparse max was accepted");
  } catch (const Error& e) {
    if (std::string(e.what()).find("kSum or kAvg only") == std::string::npos) return fail(std::string("unexpected: ") + e.what());
  }
  try {
    SparseReducer integers(*client, {{DType::kInt32, 4, 1}}, SparseOptions{});
    return fail("an integer sparse tensor was accepted");
  } catch (const Error& e) {
    if (std::string(e.what()).find("takes floating-point values") == std::string::npos) return fail(std::string("unexpected: ") + e.what());
  }
  return kOk;
}

}  // namespace

TEST_CASE("sparse: 3 ranks gather and sum their entries, every dtype, coalesced and dense, bit-exact",
          "[integration][ops][sparse]") {
  TestDaemon daemon;
  const std::string job = unique_job("sparse3");
  ClientGroup group(3, [&](int rank) { return scenario(daemon.socket(), job, rank, 3, 3, ""); });
  for (int status : group.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
}

TEST_CASE("sparse: entries said to be in device memory that cannot be read fail the call on every rank, naming the rank",
          "[integration][ops][sparse]") {
  // Rank 0's entries claim device 0 but are host memory: without a CUDA driver (CI) the copy
  // fails for want of one; with one, because the memory is not the device's. Either way rank 0
  // refuses, and rank 1, whose entries are fine, fails the same call naming it.
  TestDaemon daemon;
  const std::string job = unique_job("sparse-device");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    SparseReducer reducer(*client, kSpecs, SparseOptions{});
    const std::vector<int64_t> rows = {1, 2};
    const float values[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<SparseEntries> entries(kSpecs.size());
    entries[0] = SparseEntries{rows, values, rank == 0 ? 0 : -1};
    try {
      reducer.allreduce(entries, ReduceOptions{ReduceOp::kSum});
      return fail("entries that cannot be read were accepted");
    } catch (const Error& e) {
      const std::string want = rank == 0 ? "tensor 0's entries on device 0 could not be read: " : "rank 0 refused its entries";
      if (std::string(e.what()).find(want) == std::string::npos) return fail(std::string("unexpected error: ") + e.what());
    }
    // Host entries on both ranks still work through a new reducer.
    SparseReducer fresh(*client, kSpecs, SparseOptions{});
    entries[0].device = -1;
    const std::vector<SparseReduced> sums = fresh.allreduce(entries, ReduceOptions{ReduceOp::kSum});
    if (sums[0].indices != rows) return fail("the host entries' rows were not gathered");
    float got[8];
    std::memcpy(got, sums[0].values.data(), sizeof(got));
    for (int i = 0; i < 8; ++i) {
      if (got[i] != 2 * values[i]) return fail("element " + std::to_string(i) + " is " + std::to_string(got[i]));
    }
    return kOk;
  });
  for (int status : group.wait_all(std::chrono::seconds(60))) CHECK(exit_code(status) == kOk);
}

TEST_CASE("sparse: 2 and 3 daemons x 2 clients gather and sum their entries across nodes, bit-exact",
          "[integration][multinode][sparse]") {
  for (int nodes : {2, 3}) {
    INFO(nodes << " nodes");
    TestCluster cluster(nodes);
    const std::string job = unique_job("sparse-nodes");
    ClientGroup group(2 * nodes, [&](int rank) {
      return scenario(cluster.node(rank / 2).socket(), job, rank, 2 * nodes, 2, cluster.rendezvous());
    });
    for (int status : group.wait_all(std::chrono::seconds(120))) CHECK(exit_code(status) == kOk);
  }
}

}  // namespace gradsync::test
