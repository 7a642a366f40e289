#include "tests/bench/floors.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "client/tools/process.h"
#include "daemon/engine/gloo/engine.h"
#include "daemon/reduce/kernel.h"
#include "daemon/reduce/simd.h"
#include "shared/futex.h"

namespace gradsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Values printed by a child as "<key> <value>" lines in `file`.
std::vector<double> read_samples(const std::string& file, const std::string& key = "sample") {
  std::ifstream in(file);
  std::vector<double> samples;
  std::string word;
  double value;
  while (in >> word) {
    if (word == key && in >> value) samples.push_back(value);
  }
  return samples;
}

// This process's CPU time (all threads, user and system), in milliseconds.
double process_cpu_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// acc[i] = in[0][i] + ... + in[n-1][i], each element summed in registers across all inputs
// and stored once (fixed 16-element chunks, which -O3 vectorizes; this file is built with it).
// Compiled for AVX2 and the baseline, picked at load time: the floor gets the vector width the
// daemon's runtime-dispatched loops get.
[[gnu::noinline, gnu::target_clones("avx2", "default")]] void sum_into(float* __restrict acc, const float* const* in, size_t n, size_t begin, size_t len) {
  constexpr size_t kChunk = 16;
  size_t i = 0;
  for (; i + kChunk <= len; i += kChunk) {
    float sum[kChunk];
    for (size_t j = 0; j < kChunk; ++j) sum[j] = in[0][begin + i + j];
    for (size_t c = 1; c < n; ++c) {
      const float* __restrict x = in[c] + begin + i;
      for (size_t j = 0; j < kChunk; ++j) sum[j] += x[j];
    }
    for (size_t j = 0; j < kChunk; ++j) acc[i + j] = sum[j];
  }
  for (; i < len; ++i) {
    float sum = in[0][begin + i];
    for (size_t c = 1; c < n; ++c) sum += in[c][begin + i];
    acc[i] = sum;
  }
}

// `count` floats of shared anonymous memory, unmapped on destruction.
class SharedFloats {
 public:
  explicit SharedFloats(size_t count) : bytes_(count * sizeof(float)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<float*>(p);
  }
  ~SharedFloats() {
    if (data_) ::munmap(data_, bytes_);
  }
  SharedFloats(const SharedFloats&) = delete;
  SharedFloats& operator=(const SharedFloats&) = delete;
  float* data() const { return data_; }

 private:
  size_t bytes_;
  float* data_ = nullptr;
};

// The least an in-place all-reduce of `clients` buffers can do, in the kernel's shape without
// its generality: per L1-sized block, read every buffer once, summing in registers, then copy
// the block into every buffer. Plain float loops, vectorized by the compiler. Shared memory,
// like the trainers' segments (and so no transparent huge pages either).
//
// `scatter`: the least a reduce-scatter does instead: each block, summed the same way, is
// written once, into its owner's shard (one output of S bytes split by owner), and the inputs
// are left as they were: read N x S bytes, write S.
class InPlaceReduction {
 public:
  InPlaceReduction(int clients, size_t bytes_per_client, bool scatter = false) : n_(bytes_per_client / sizeof(float)) {
    if (scatter) {
      output_ = std::make_unique<SharedFloats>(n_);
      if (!output_->data()) return;
    }
    for (int c = 0; c < clients; ++c) {
      owners_.push_back(std::make_unique<SharedFloats>(n_));
      if (!owners_.back()->data()) return;
      buffers_.push_back(owners_.back()->data());
      for (size_t i = 0; i < n_; ++i) buffers_.back()[i] = static_cast<float>((i + static_cast<size_t>(c)) % 7);
    }
    inputs_.assign(buffers_.begin(), buffers_.end());
  }
  bool ok() const { return buffers_.size() == owners_.size() && !buffers_.empty() && (!output_ || output_->data()); }

  // One pass with the daemon's own reduction kernel (reduce/kernel.h: SIMD dispatch, its
  // accumulator placement, streaming stores where they pay) over the same buffers on `threads`
  // threads: the kernel alone, with nothing of the daemon around it.
  void kernel_pass(int threads) {
    std::vector<std::jthread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([this, t, threads] {
        const size_t lo = n_ * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t hi = n_ * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        std::vector<const void*> in;
        std::vector<void*> out;
        for (const float* b : inputs_) in.push_back(b + lo);
        if (output_) {
          out.push_back(output_->data() + lo);
        } else {
          for (float* b : buffers_) out.push_back(b + lo);
        }
        reduce::KernelArgs args;
        args.stream_outputs = output_ != nullptr;  // as the daemon: in place, the lines are cached
        reduce::reduce(args, in, out, hi - lo);
      });
    }
  }

  // One pass over every buffer on `threads` threads, each its own share of the elements.
  // `stream`: the copies out are streaming stores (each line written once, never read for
  // ownership first), as gradsync's kernel writes results nobody reads soon.
  void pass(int threads, bool stream = false) {
    std::vector<std::jthread> workers;  // joined however this returns
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([this, t, threads, stream] {
        constexpr size_t kBlock = 8192;
        std::vector<float> acc(kBlock);
        const size_t lo = n_ * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t hi = n_ * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        for (size_t b = lo; b < hi; b += kBlock) {
          const size_t len = std::min(hi, b + kBlock) - b;
          sum_into(acc.data(), inputs_.data(), inputs_.size(), b, len);
          const auto copy = [&](float* to) {
            if (stream) {
              reduce::simd::stream_copy(to, acc.data(), len * sizeof(float));
            } else {
              std::memcpy(to, acc.data(), len * sizeof(float));
            }
          };
          if (output_) {
            copy(output_->data() + b);
            continue;
          }
          for (float* buffer : buffers_) copy(buffer + b);
        }
        if (stream) reduce::simd::stream_fence();
      });
    }
  }

 private:
  size_t n_;
  std::vector<std::unique_ptr<SharedFloats>> owners_;
  std::vector<float*> buffers_;
  std::vector<const float*> inputs_;
  std::unique_ptr<SharedFloats> output_;  // reduce-scatter: the shards, back to back
};

}  // namespace

Measurement memory_floor(int clients, size_t bytes_per_client, int threads, int runs, bool scatter) {
  InPlaceReduction reduction(clients, bytes_per_client, scatter);
  if (!reduction.ok()) return missing("mmap of the memory floor's shared buffers failed");
  reduction.pass(threads);  // fault the pages in
  // The floor is the fastest way this machine has to move those bytes: each run times the pass
  // with plain stores, with streaming stores, and with the daemon's own kernel (which wins
  // depends on the machine and the sizes), and keeps the fastest.
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    double best = 0;
    for (int variant = 0; variant < 3; ++variant) {
      const auto start = Clock::now();
      if (variant < 2) {
        reduction.pass(threads, variant == 1);
      } else {
        reduction.kernel_pass(threads);
      }
      const double took = ms_since(start);
      best = best == 0 ? took : std::min(best, took);
    }
    ms.push_back(best);
  }
  // The best run: a floor is the least the machine did, not its typical time.
  return measured({*std::min_element(ms.begin(), ms.end())});
}

namespace {

// Pins the calling process to CPU `cpu` when the machine has it (two spinning processes on one
// CPU would measure the scheduler, not the cache line).
void pin_to(int cpu) {
  if (static_cast<int>(std::thread::hardware_concurrency()) <= cpu) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof(set), &set);
}

// Two processes spinning on one cache line in shared memory, each on a CPU of its own: odd
// values are pings, even values pongs. The round trip is two cache-line transfers between cores,
// the least in which any two processes can meet; gradsync's round trip cannot beat it.
Measurement spin_floor(int rounds) {
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return missing("mmap of the shared cache line failed");
  auto* word = new (shared) std::atomic<uint32_t>(0);
  const uint32_t last = 2 * static_cast<uint32_t>(rounds) + 200;
  const pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin_to(1);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    for (uint32_t v = 1; v < last; v += 2) {
      for (uint64_t spins = 0; word->load(std::memory_order_acquire) != v; ++spins) {
        if ((spins & 0xffff) == 0 && Clock::now() > deadline) ::_exit(1);
      }
      word->store(v + 1, std::memory_order_release);
    }
    ::_exit(0);
  }
  cpu_set_t before;
  ::sched_getaffinity(0, sizeof(before), &before);
  pin_to(0);
  std::vector<double> us;
  bool answered = true;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (uint32_t v = 1; answered && v < last; v += 2) {
    const auto start = Clock::now();
    word->store(v, std::memory_order_release);
    for (uint64_t spins = 0; word->load(std::memory_order_acquire) != v + 1; ++spins) {
      if ((spins & 0xffff) == 0 && Clock::now() > deadline) {
        answered = false;
        break;
      }
    }
    if (v > 200) us.push_back(ms_since(start) * 1000);  // after 100 warm-up rounds
  }
  ::sched_setaffinity(0, sizeof(before), &before);
  if (!answered) ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::munmap(shared, 4096);
  return exited_ok(status) ? measured(std::move(us)) : missing("the spinning partner " + describe_wait_status(status));
}

}  // namespace

Wakeup wakeup_floor(int rounds) {
  Wakeup result;
  result.spin_us = spin_floor(rounds);
  // Futex ping-pong between this process and a forked child over one shared word: odd values
  // are pings, even values pongs.
  void* shared = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    result.futex_us = missing("mmap of the shared futex word failed");
  } else {
    auto* word = new (shared) std::atomic<uint32_t>(0);
    // Both sides give up after 30 s without an answer; the child also dies with the bench.
    const auto give_up = [] { return Clock::now() + std::chrono::seconds(30); };
    const pid_t child = ::fork();
    if (child == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (uint32_t v = 1; v < 2 * static_cast<uint32_t>(rounds) + 200; v += 2) {
        const auto deadline = give_up();
        while (word->load() != v) {
          if (Clock::now() > deadline) ::_exit(1);
          futex_wait(word, v - 1, std::chrono::milliseconds(100));
        }
        word->store(v + 1);
        futex_wake_all(word);
      }
      ::_exit(0);
    }
    std::vector<double> us;
    bool answered = true;
    for (uint32_t v = 1; answered && v < 2 * static_cast<uint32_t>(rounds) + 200; v += 2) {
      const auto start = Clock::now();
      const auto deadline = give_up();
      word->store(v);
      futex_wake_all(word);
      while (answered && word->load() != v + 1) {
        answered = Clock::now() < deadline;
        futex_wait(word, v, std::chrono::milliseconds(100));
      }
      if (v > 200) us.push_back(ms_since(start) * 1000);  // after 100 warm-up rounds
    }
    if (!answered) ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ::munmap(shared, 4096);
    result.futex_us = exited_ok(status) ? measured(std::move(us)) : missing("the futex partner " + describe_wait_status(status));
  }
  // The same over two pipes.
  int ping[2], pong[2];
  if (::pipe(ping) != 0 || ::pipe(pong) != 0) {
    result.pipe_us = missing("pipe() failed");
    return result;
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // Only the ends it uses, so the parent closing its write end ends the loop.
    ::close(ping[1]);
    ::close(pong[0]);
    char byte;
    while (::read(ping[0], &byte, 1) == 1) {
      if (::write(pong[1], &byte, 1) != 1) break;
    }
    ::_exit(0);
  }
  ::close(ping[0]);
  ::close(pong[1]);
  std::vector<double> us;
  char byte = 'x';
  bool failed = false;
  for (int r = 0; r < rounds + 100 && !failed; ++r) {
    const auto start = Clock::now();
    failed = ::write(ping[1], &byte, 1) != 1 || ::read(pong[0], &byte, 1) != 1;
    if (r >= 100) us.push_back(ms_since(start) * 1000);
  }
  for (int fd : {ping[1], pong[0]}) ::close(fd);
  ::waitpid(child, nullptr, 0);
  result.pipe_us = failed ? missing("the pipe partner stopped answering") : measured(std::move(us));
  return result;
}

GlooFloor gloo_alone(const std::string& self, int processes, size_t bytes, size_t slice, int steps,
                     const LocalWork& local) {
  std::string pattern = temp_pattern("gradsync-bench-gloo-XXXXXX");
  if (!::mkdtemp(pattern.data())) return {missing("mkdtemp for the Gloo store failed")};
  const std::string dir = pattern;
  auto out_of = [&](int r) { return dir + "/rank" + std::to_string(r) + ".out"; };
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < processes; ++r) {
    ranks.emplace_back(std::vector<std::string>{self, "--role", "gloo-floor", "--store", dir + "/store", "--rank",
                                                std::to_string(r), "--size", std::to_string(processes), "--bytes",
                                                std::to_string(bytes), "--slice-bytes", std::to_string(slice),
                                                "--steps", std::to_string(steps), "--local-clients",
                                                std::to_string(local.clients), "--threads", std::to_string(local.threads)},
                       out_of(r));
  }
  std::string failure;
  const auto deadline = Clock::now() + std::chrono::minutes(5);
  for (auto& rank : ranks) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int status = rank.wait_for(std::max(left, std::chrono::milliseconds(0)));
    if (!exited_ok(status) && failure.empty()) {
      failure = status == -1 ? "the Gloo ranks did not finish in 5 minutes" : "a Gloo rank " + describe_wait_status(status);
    }
  }
  std::vector<double> samples = read_samples(out_of(0), "sample");
  double cpu = 0;
  for (int r = 0; r < processes; ++r) {
    const std::vector<double> mine = read_samples(out_of(r), "cpu");
    cpu = mine.empty() || cpu < 0 ? -1 : cpu + mine.front();
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!failure.empty()) return {missing(failure)};
  if (samples.empty()) return {missing("the Gloo ranks printed no samples")};
  return {measured(std::move(samples)), cpu};
}

int run_gloo_rank(const std::string& store_dir, int rank, int size, size_t bytes, size_t slice_bytes, int steps,
                  const LocalWork& local, const std::string& host) {
  try {
    std::unique_ptr<InPlaceReduction> node_work;
    if (local.clients > 0) {
      node_work = std::make_unique<InPlaceReduction>(local.clients, bytes);
      if (!node_work->ok()) throw std::runtime_error("mmap of the local buffers failed");
      node_work->pass(local.threads);  // fault the pages in
    }
    std::filesystem::create_directories(store_dir);
    ::gloo::rendezvous::FileStore store(store_dir);
    ::gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::seconds(120));
    context->connectFullMesh(store, device);
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    // What gradsync's daemons run between nodes for such a buffer: one Gloo allreduce per
    // slice (the daemons' --gloo-slice-bytes), each with the algorithm the Gloo engine picks
    // for its size (daemon/engine/gloo/engine.h), one after another, without the local stages.
    const size_t slice = std::max<size_t>(1, slice_bytes / sizeof(float));
    double cpu_start = 0;
    for (int s = 0; s < steps + 2; ++s) {
      if (s == 2) cpu_start = process_cpu_ms();
      const auto start = Clock::now();
      // The local work runs beside the Gloo calls, as a perfect overlap would run it.
      std::jthread beside;  // joined on every way out of the step, a Gloo exception included
      if (node_work) beside = std::jthread([&] { node_work->pass(local.threads); });
      for (size_t first = 0; first < data.size(); first += slice) {
        const size_t count = std::min(slice, data.size() - first);
        ::gloo::AllreduceOptions opts(context);
        opts.setOutput(data.data() + first, count);  // in place, as the engine calls it
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<float>));
        opts.setAlgorithm(count * sizeof(float) < gloo_engine::kBcubeBelowBytes
                              ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                              : ::gloo::AllreduceOptions::Algorithm::RING);
        ::gloo::allreduce(opts);
      }
      if (beside.joinable()) beside.join();
      if (rank == 0 && s >= 2) std::printf("sample %.4f\n", ms_since(start));
    }
    std::printf("cpu %.4f\n", (process_cpu_ms() - cpu_start) / std::max(steps, 1));
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo floor rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace gradsync::bench
