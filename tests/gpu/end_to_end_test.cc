// The real daemon and real client processes on one GPU: device memory allocated by the client
// library (VMM), passed by fd, imported by gradsyncd, and reduced by its CUDA executor across
// clients that share the GPU. Exact values, so every element is checked.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cuda_runtime.h>

#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <random>
#include <cstring>
#include <thread>
#include <vector>

#include "daemon/reduce/simd.h"
#include "gradsync/client.h"
#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

// How long one operation, and one test case's processes, may take on the GPU. Short next to
// the device check's 55 s stage, so that one hung case fails by name and the others still run.
constexpr std::chrono::seconds kOperationBound{15};
constexpr std::chrono::seconds kCaseBound{25};

// 161 tensors would do; a few of odd sizes cover the same paths faster.
const std::vector<TensorSpec> kSpecs = {{DType::kFloat32, 37, "dp"}, {DType::kFloat32, 1 << 20, "dp"},
                                        {DType::kFloat32, 9001, "dp"}};

float value(int rank, size_t i) { return static_cast<float>(rank * 3 + static_cast<int>(i % 5)); }

// Fills tensor t of `rank` on the device, through the host.
bool fill(const SharedTensor& tensor, int rank) {
  std::vector<float> host(tensor.numel());
  for (size_t i = 0; i < host.size(); ++i) host[i] = value(rank, i);
  return cudaMemcpy(tensor.data(), host.data(), tensor.bytes(), cudaMemcpyHostToDevice) == cudaSuccess;
}

std::vector<float> read(const SharedTensor& tensor) {
  std::vector<float> host(tensor.numel());
  if (cudaMemcpy(host.data(), tensor.data(), tensor.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) host.clear();
  return host;
}

int run_ranks(int world, const std::function<int(int, Client&, const std::vector<SharedTensor>&, const TensorSet&)>& body) {
  TestDaemon daemon;
  const std::string job = unique_job("gpu");
  ClientGroup group(world, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, world);
    const std::vector<SharedTensor> tensors = client->allocate_device_flat(kSpecs, 0);
    for (const SharedTensor& t : tensors) {
      if (!fill(t, rank)) return fail("cudaMemcpy to the device failed");
    }
    const TensorSet set = client->register_tensors(tensors, {});
    return body(rank, *client, tensors, set);
  });
  int failed = 0;
  for (int status : group.wait_all(kCaseBound)) failed += exit_code(status) != kOk;
  return failed;
}

// The host's sum of squares of the float32 tensors' contents, block by block in the order the
// health defines (reduce/health.h): what a device allreduce's sq_norm must equal bit for bit.
double host_sq_norm(const std::vector<SharedTensor>& tensors) {
  double sum = 0;
  for (const SharedTensor& t : tensors) {
    const std::vector<float> got = read(t);
    for (size_t first = 0; first < got.size(); first += reduce::kHealthBlockElements) {
      const size_t n = std::min<size_t>(reduce::kHealthBlockElements, got.size() - first);
      sum = sum + reduce::simd::health(DType::kFloat32, got.data() + first, n).sum_sq;
    }
  }
  return sum;
}

}  // namespace

TEST_CASE("gpu end to end: allreduce sum and avg across 2 and 3 clients on one GPU, every element", "[gpu][e2e]") {
  for (int world : {2, 3}) {
    INFO(world << " clients");
    CHECK(run_ranks(world, [&](int rank, Client& client, const std::vector<SharedTensor>& tensors, const TensorSet& set) {
            if (!client.allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
            for (const SharedTensor& t : tensors) {
              const std::vector<float> got = read(t);
              for (size_t i = 0; i < got.size(); ++i) {
                float want = 0;
                for (int r = 0; r < world; ++r) want += value(r, i);
                if (got[i] != want) return fail("sum: element " + std::to_string(i) + " is " + std::to_string(got[i]));
              }
            }
            // Once more with avg over the summed values: sum * world / world, exact.
            if (!client.allreduce(set, ReduceOptions{ReduceOp::kAvg}).wait(kOperationBound)) return fail("timed out");
            for (const SharedTensor& t : tensors) {
              const std::vector<float> got = read(t);
              for (size_t i = 0; i < got.size(); ++i) {
                float want = 0;
                for (int r = 0; r < world; ++r) want += value(r, i);
                if (got[i] != want) return fail("avg: element " + std::to_string(i) + " is " + std::to_string(got[i]));
              }
            }
            (void)rank;
            return kOk;
          }) == 0);
  }
}

// Fused health on the GPU: found_inf and sq_norm of the reduced set equal what the host
// computes from the same result (reduce/health.h's blocks, bit for bit); then an inf in one
// rank's tensor is found by every rank.
TEST_CASE("gpu end to end: the health of a device allreduce equals the host's, and an inf is found", "[gpu][e2e][health]") {
  CHECK(run_ranks(2, [&](int rank, Client& client, const std::vector<SharedTensor>& tensors, const TensorSet& set) {
          // Random float32s (full mantissas): a sum of their squares depends on the order of
          // the additions, which is what must match the host's.
          std::mt19937 rng(static_cast<unsigned>(rank + 1));
          std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
          for (const SharedTensor& t : tensors) {
            std::vector<float> host(t.numel());
            for (float& v : host) v = uniform(rng);
            if (cudaMemcpy(t.data(), host.data(), t.bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
              return fail("cudaMemcpy to the device failed");
            }
          }
          ReduceOptions options{ReduceOp::kAvg};
          options.health = true;
          Work work = client.allreduce(set, options);
          if (!work.wait(kOperationBound)) return fail("timed out");
          const double want = host_sq_norm(tensors);
          const double sq_norm = work.sq_norm();
          std::printf("health: rank %d sq_norm=%.17g (host %.17g)\n", rank, sq_norm, want);
          if (work.found_inf()) return fail("found_inf on finite gradients");
          if (std::memcmp(&sq_norm, &want, sizeof want) != 0) return fail("sq_norm differs from the host's");
          if (rank == 1) {
            const float inf = INFINITY;
            if (cudaMemcpy(tensors[2].data() + 5000 * sizeof(float), &inf, sizeof inf, cudaMemcpyHostToDevice) !=
                cudaSuccess) {
              return fail("cudaMemcpy to the device failed");
            }
          }
          Work again = client.allreduce(set, options);
          if (!again.wait(kOperationBound)) return fail("timed out");
          if (!again.found_inf()) return fail("the inf in rank 1's tensor 2 was not found");
          return kOk;
        }) == 0);
}

// Device memory goes back before the client leaves: once every rank released the set, the
// daemon drops it (after its GPU work, and NCCL's registration where there is one), and the free
// is answered; until then it is refused as still used. New memory then reduces as before.
TEST_CASE("gpu end to end: device memory of a released set is freed, and new memory reduces", "[gpu][e2e][free]") {
  CHECK(run_ranks(2, [&](int rank, Client& client, const std::vector<SharedTensor>& tensors, const TensorSet& set) {
          if (!client.allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
          client.release(set);
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          for (int refused = 0;; ++refused) {
            try {
              client.free_memory(tensors[0]);
              std::printf("free: rank %d freed its device memory after %d refusals\n", rank, refused);
              break;
            } catch (const Error& e) {
              if (e.code() != ErrorCode::kInvalidArgument || std::chrono::steady_clock::now() > deadline) {
                return fail(std::string("free_memory of device memory: ") + e.what());
              }
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
          }
          const std::vector<SharedTensor> again = client.allocate_device_flat(kSpecs, 0);
          for (const SharedTensor& t : again) {
            if (!fill(t, rank + 10)) return fail("cudaMemcpy to the device failed");
          }
          const TensorSet second = client.register_tensors(again, {});
          if (!client.allreduce(second, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
          for (const SharedTensor& t : again) {
            const std::vector<float> got = read(t);
            for (size_t i = 0; i < got.size(); ++i) {
              const float want = value(10, i) + value(11, i);
              if (got[i] != want) return fail("after the free: element " + std::to_string(i) + " is " + std::to_string(got[i]));
            }
          }
          return kOk;
        }) == 0);
}

// Masked reduction on the GPU: every third element of the flat set and a run of 1000 are
// summed across 2 clients; every other element becomes zero.
TEST_CASE("gpu end to end: a masked allreduce sums the kept elements, zeroes the others, and its health is theirs",
          "[gpu][e2e][masked]") {
  TestDaemon daemon;
  const std::string job = unique_job("gpu-masked");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<SharedTensor> tensors = client->allocate_device_flat(kSpecs, 0);
    for (const SharedTensor& t : tensors) {
      if (!fill(t, rank)) return fail("cudaMemcpy to the device failed");
    }
    uint64_t total = 0;
    for (const SharedTensor& t : tensors) total += t.numel();
    std::vector<uint64_t> mask;
    for (uint64_t i = 0; i < total; ++i) {
      if (i % 3 == 0 || (i >= 5000 && i < 6000)) mask.push_back(i);
    }
    const TensorSet set = client->register_tensors(tensors, RegisterOptions{.mask = mask});
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
    uint64_t flat = 0;
    for (const SharedTensor& t : tensors) {
      const std::vector<float> got = read(t);
      for (size_t i = 0; i < got.size(); ++i, ++flat) {
        const bool kept = flat % 3 == 0 || (flat >= 5000 && flat < 6000);
        const float want = kept ? value(0, i) + value(1, i) : 0.0f;
        if (got[i] != want) return fail("flat element " + std::to_string(flat) + " is " + std::to_string(got[i]));
      }
    }
    // The fused health of the masked results: an inf rank 1 puts at a dropped element (flat 1)
    // is not found and the norm is the host's over the results; one at a kept element (flat 3)
    // is found.
    ReduceOptions healthy{ReduceOp::kSum};
    healthy.health = true;
    for (uint64_t at : {uint64_t{1}, uint64_t{3}}) {
      for (const SharedTensor& t : tensors) {
        if (!fill(t, rank)) return fail("cudaMemcpy to the device failed");
      }
      const float inf = INFINITY;
      if (rank == 1 &&
          cudaMemcpy(tensors[0].data() + at * sizeof(float), &inf, sizeof inf, cudaMemcpyHostToDevice) != cudaSuccess) {
        return fail("cudaMemcpy to the device failed");
      }
      Work work = client->allreduce(set, healthy);
      if (!work.wait(kOperationBound)) return fail("the health allreduce timed out");
      if (work.found_inf() != (at == 3)) {
        return fail("an inf at flat element " + std::to_string(at) + (at == 3 ? " (kept) was not found" : " (dropped) was found"));
      }
      if (at == 1) {
        const double want = host_sq_norm(tensors);
        const double sq_norm = work.sq_norm();
        std::printf("masked health: rank %d sq_norm=%.17g (host %.17g)\n", rank, sq_norm, want);
        if (std::memcmp(&sq_norm, &want, sizeof want) != 0) return fail("masked sq_norm differs from the host's");
      }
    }
    return kOk;
  });
  for (int status : group.wait_all(kCaseBound)) CHECK(exit_code(status) == kOk);
}

TEST_CASE("gpu end to end: broadcast from rank 1 and reduce to rank 0", "[gpu][e2e]") {
  CHECK(run_ranks(3, [&](int rank, Client& client, const std::vector<SharedTensor>& tensors, const TensorSet& set) {
          if (!client.reduce(set, 0, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
          for (const SharedTensor& t : tensors) {
            const std::vector<float> got = read(t);
            for (size_t i = 0; i < got.size(); ++i) {
              const float want = rank == 0 ? value(0, i) + value(1, i) + value(2, i) : value(rank, i);
              if (got[i] != want) return fail("reduce: element " + std::to_string(i) + " is " + std::to_string(got[i]));
            }
          }
          for (const SharedTensor& t : tensors) {
            if (!fill(t, rank)) return fail("refill");
          }
          if (!client.broadcast(set, 1).wait(kOperationBound)) return fail("timed out");
          for (const SharedTensor& t : tensors) {
            const std::vector<float> got = read(t);
            for (size_t i = 0; i < got.size(); ++i) {
              if (got[i] != value(1, i)) return fail("broadcast: element " + std::to_string(i));
            }
          }
          return kOk;
        }) == 0);
}

TEST_CASE("gpu end to end: allgather across 2 and 3 clients on one GPU, every rank's bytes in every output",
          "[gpu][e2e][allgather]") {
  for (int world : {2, 3}) {
    INFO(world << " clients");
    TestDaemon daemon;
    const std::string job = unique_job("gpu-allgather");
    ClientGroup group(world, [&](int rank) {
      auto client = join(daemon.socket(), job, rank, world);
      const std::vector<SharedTensor> tensors = client->allocate_device_flat(kSpecs, 0);
      for (const SharedTensor& t : tensors) {
        if (!fill(t, rank)) return fail("cudaMemcpy to the device failed");
      }
      const TensorSet set = client->register_tensors(tensors, RegisterOptions{.allgather = true});
      if (!client->allgather(set).wait(kOperationBound)) return fail("timed out");
      for (int from = 0; from < world; ++from) {
        for (size_t i = 0; i < tensors.size(); ++i) {
          const SharedTensor out = set.gathered(from, i);
          if (out.device() != 0) return fail("gathered output is not on GPU 0");
          const std::vector<float> got = read(out);
          for (size_t k = 0; k < got.size(); ++k) {
            if (got[k] != value(from, k)) {
              return fail("rank " + std::to_string(from) + " tensor " + std::to_string(i) + " element " +
                          std::to_string(k) + " is " + std::to_string(got[k]));
            }
          }
        }
      }
      return kOk;
    });
    for (int status : group.wait_all(kCaseBound)) CHECK(exit_code(status) == kOk);
  }
}

TEST_CASE("gpu end to end: reduce_scatter across 2 and 3 clients on one GPU, each rank's shard of the sum",
          "[gpu][e2e][reduce_scatter]") {
  for (int world : {2, 3}) {
    INFO(world << " clients");
    TestDaemon daemon;
    const std::string job = unique_job("gpu-reduce-scatter");
    ClientGroup group(world, [&](int rank) {
      auto client = join(daemon.socket(), job, rank, world);
      const std::vector<SharedTensor> tensors = client->allocate_device_flat(kSpecs, 0);
      for (const SharedTensor& t : tensors) {
        if (!fill(t, rank)) return fail("cudaMemcpy to the device failed");
      }
      // Buckets of 1 MiB: the shards are cut by buckets and by tensors.
      const TensorSet set =
          client->register_tensors(tensors, RegisterOptions{.bucket_cap_bytes = 1 << 20, .reduce_scatter = true});
      if (!client->reduce_scatter(set, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
      const SharedTensor shard = set.shard();
      if (shard.device() != 0) return fail("the shard is not on GPU 0");
      const std::vector<float> got = read(shard);
      uint64_t flat = 0;
      for (const TensorSpec& spec : kSpecs) {
        for (uint64_t i = 0; i < spec.numel; ++i, ++flat) {
          if (flat < set.shard_first() || flat >= set.shard_first() + got.size()) continue;
          float want = 0;
          for (int r = 0; r < world; ++r) want += value(r, i);
          if (got[flat - set.shard_first()] != want) {
            return fail("shard element " + std::to_string(flat - set.shard_first()) + " is " +
                        std::to_string(got[flat - set.shard_first()]) + ", want " + std::to_string(want));
          }
        }
      }
      return kOk;
    });
    for (int status : group.wait_all(kCaseBound)) CHECK(exit_code(status) == kOk);
  }
}

TEST_CASE("gpu end to end: a client killed mid-step, with a bucket of its already queued, fails the other cleanly",
          "[gpu][e2e]") {
  // A small bucket cap puts the tensors in separate buckets. Rank 1 marks the last-registered
  // tensor ready (bucket 0 then launches on the GPU) and dies before marking the rest. The daemon must fail the step naming rank 1, drain
  // what it queued, and stay up for the next job.
  TestDaemon daemon;
  const std::string job = unique_job("gpu-kill-mid");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<SharedTensor> tensors = client->allocate_device_flat(kSpecs, 0);
    const TensorSet set = client->register_tensors(tensors, RegisterOptions{.bucket_cap_bytes = 4096});
    if (set.buckets().size() < 2) return fail("expected several buckets");
    const Work work = client->allreduce_deferred(set, ReduceOptions{});
    client->mark_ready(set, static_cast<uint32_t>(tensors.size() - 1));
    if (rank == 1) {
      ::usleep(200'000);  // bucket 0 is launched by now
      ::raise(SIGKILL);
    }
    try {
      for (uint32_t i = 0; i + 1 < tensors.size(); ++i) client->mark_ready(set, i);
      work.wait(kOperationBound);
      return fail("the step completed without rank 1");
    } catch (const Error& e) {
      if (std::string(e.what()).find("rank 1") == std::string::npos) return fail(std::string("unexpected: ") + e.what());
    }
    return kOk;
  });
  CHECK(exit_code(group.wait(0, std::chrono::seconds(120))) == kOk);
  group.wait(1, std::chrono::seconds(10));
  CHECK(daemon.running());
  CHECK_THAT(daemon.log(), !Catch::Contains("did not drain"));
  // The daemon serves the next job on the same GPU.
  CHECK(run_ranks(2, [&](int, Client& client, const std::vector<SharedTensor>&, const TensorSet& set) {
          return client.allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound) ? kOk
                                                                                                      : fail("timed out");
        }) == 0);
}

TEST_CASE("gpu end to end: a client killed mid-job fails the other, naming it", "[gpu][e2e]") {
  TestDaemon daemon;
  const std::string job = unique_job("gpu-kill");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<SharedTensor> tensors = client->allocate_device_flat(kSpecs, 0);
    const TensorSet set = client->register_tensors(tensors, {});
    if (rank == 1) ::raise(SIGKILL);  // after registering, before its first step
    try {
      client->allreduce(set, ReduceOptions{}).wait(kOperationBound);
      return fail("the step completed without rank 1");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kPeerLost || std::string(e.what()).find("rank 1") == std::string::npos) {
        return fail(std::string("unexpected: ") + e.what());
      }
    }
    return kOk;
  });
  CHECK(exit_code(group.wait(0, std::chrono::seconds(120))) == kOk);
  const int killed = group.wait(1, std::chrono::seconds(10));
  CHECK((WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL));
  CHECK(daemon.running());
}

TEST_CASE("gpu end to end: the daemon reads only after the client's stream wrote, and wait_stream orders the reader",
          "[gpu][e2e][events]") {
  // Each rank's inputs arrive on its own stream 300 ms late (a host function holds the stream,
  // then an async copy from pinned memory writes the values). The allreduce is submitted at
  // once with that stream current: only the ready event keeps the daemon from reading the
  // zeros that are there before. The results are read back on a second stream ordered by
  // Work::wait_stream, without a host wait for the GPU.
  CHECK(run_ranks(2, [&](int rank, Client& client, const std::vector<SharedTensor>& tensors, const TensorSet& set) {
          cudaStream_t writer = nullptr, reader = nullptr;
          if (cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking) != cudaSuccess ||
              cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking) != cudaSuccess) {
            return fail("cudaStreamCreate");
          }
          std::vector<float*> pinned;
          for (const SharedTensor& t : tensors) {
            float* host = nullptr;
            if (cudaMallocHost(&host, t.bytes()) != cudaSuccess) return fail("cudaMallocHost");
            pinned.push_back(host);
          }
          // Zeros on the device first, synchronously, so a premature read is visible.
          for (const SharedTensor& t : tensors) {
            if (cudaMemset(t.data(), 0, t.bytes()) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
              return fail("cudaMemset");
            }
          }
          if (cudaLaunchHostFunc(writer, [](void*) { ::usleep(300'000); }, nullptr) != cudaSuccess) {
            return fail("cudaLaunchHostFunc");
          }
          for (size_t k = 0; k < tensors.size(); ++k) {
            for (size_t i = 0; i < tensors[k].numel(); ++i) pinned[k][i] = value(rank, i);
            if (cudaMemcpyAsync(tensors[k].data(), pinned[k], tensors[k].bytes(), cudaMemcpyHostToDevice, writer) !=
                cudaSuccess) {
              return fail("cudaMemcpyAsync");
            }
          }
          client.set_stream(writer);
          const Work work = client.allreduce(set, ReduceOptions{ReduceOp::kSum});
          if (!work.wait_stream(reader, kOperationBound)) return fail("timed out");
          for (size_t k = 0; k < tensors.size(); ++k) {
            std::fill(pinned[k], pinned[k] + tensors[k].numel(), -1.0f);
            if (cudaMemcpyAsync(pinned[k], tensors[k].data(), tensors[k].bytes(), cudaMemcpyDeviceToHost, reader) !=
                cudaSuccess) {
              return fail("cudaMemcpyAsync back");
            }
          }
          if (cudaStreamSynchronize(reader) != cudaSuccess) return fail("cudaStreamSynchronize");
          for (size_t k = 0; k < tensors.size(); ++k) {
            for (size_t i = 0; i < tensors[k].numel(); ++i) {
              const float want = value(0, i) + value(1, i);
              if (pinned[k][i] != want) {
                return fail("tensor " + std::to_string(k) + " element " + std::to_string(i) + " is " +
                            std::to_string(pinned[k][i]) + ", want " + std::to_string(want) +
                            " (read before the writer finished, or written back after the reader)");
              }
            }
          }
          for (float* host : pinned) cudaFreeHost(host);
          cudaStreamDestroy(writer);
          cudaStreamDestroy(reader);
          return kOk;
        }) == 0);
}

TEST_CASE("gpu end to end: memory from cudaMalloc through the legacy route, for a trusted user only", "[gpu][e2e][legacy]") {
  // Two tensors carved out of one cudaMalloc allocation per rank: one IPC handle, opened once by
  // the daemon for both.
  TestDaemon daemon({"--legacy-ipc-uid", std::to_string(::getuid())});
  const std::string job = unique_job("gpu-legacy");
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    float* base = nullptr;
    if (cudaMalloc(&base, (1 << 20) * sizeof(float)) != cudaSuccess) return fail("cudaMalloc");
    const std::vector<SharedTensor> tensors = {
        client->share_device({DType::kFloat32, 1000, "dp"}, base + 16, 0),
        client->share_device({DType::kFloat32, 5000, "dp"}, base + 4096, 0)};
    for (const SharedTensor& t : tensors) {
      if (!fill(t, rank)) return fail("cudaMemcpy to the device failed");
    }
    const TensorSet set = client->register_tensors(tensors, {});
    if (!client->allreduce(set, ReduceOptions{ReduceOp::kSum}).wait(kOperationBound)) return fail("timed out");
    for (const SharedTensor& t : tensors) {
      const std::vector<float> got = read(t);
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != value(0, i) + value(1, i)) return fail("legacy: element " + std::to_string(i));
      }
    }
    // The daemon closes its opening when the job is over, after the clients went: only then
    // may the memory be freed (README: the legacy route's lifetime rule).
    client.reset();
    const std::string ended = "job=" + job + " uid=" + std::to_string(::getuid()) + ": ended";
    for (int i = 0; i < 1000 && daemon.log().find(ended) == std::string::npos; ++i) ::usleep(10'000);
    if (daemon.log().find(ended) == std::string::npos) return fail("the job did not end within 10 s");
    ::usleep(200'000);  // the job's worker stops (and lets go of the sets) just after that line
    cudaFree(base);
    return kOk;
  });
  for (int status : group.wait_all(kCaseBound)) CHECK(exit_code(status) == kOk);
  const std::string log = daemon.log();
  const std::string marker = "CUDA legacy IPC segment of 4000 bytes on GPU 0 imported in import_ms=";
  CHECK_THAT(log, Catch::Contains(marker));
  if (const size_t at = log.find(marker); at != std::string::npos) {
    // For the device check's table (d): the daemon's cudaIpcOpenMemHandle time.
    std::printf("legacy: IPC handle opened in gradsyncd in legacy_import_ms=%s\n",
                log.substr(at + marker.size(), log.find('\n', at) - at - marker.size()).c_str());
  }
  // Without the trust setting, the daemon refuses it, naming the setting.
  TestDaemon strict;
  ClientGroup refused(1, [&](int) {
    auto client = join(strict.socket(), unique_job("gpu-legacy-strict"), 0, 1);
    float* base = nullptr;
    if (cudaMalloc(&base, 4096) != cudaSuccess) return fail("cudaMalloc");
    try {
      client->share_device({DType::kFloat32, 16, "dp"}, base, 0);
      return fail("an untrusted legacy handle was taken");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kPermissionDenied || std::string(e.what()).find("--legacy-ipc-uid") == std::string::npos) {
        return fail(std::string("unexpected: ") + e.what());
      }
    }
    return kOk;
  });
  CHECK(exit_code(refused.wait(0, kOperationBound)) == kOk);
}

}  // namespace gradsync::test
