// The floor under row (b)'s 4 KiB round trip: the same signalling gradsync does between a
// trainer and gradsyncd, with nothing of gradsync in it. A "trainer" records an interprocess
// event and writes a byte to a pipe; a "daemon" reads it, polls that event from the host
// (cudaEventQuery, as gradsyncd does), launches one tiny kernel, records its own interprocess
// event and writes a byte back; the trainer polls that event. Timed at the trainer, from its
// record to seeing the daemon's event, so the GPU's switches between the two CUDA contexts are
// in it (without MPS they time-slice) and the daemon's protocol, planning and sockets are not.
// Run once with the two roles in two processes (two contexts, as gradsync is) and once as two
// threads of one process (one context, as under MPS the two share the GPU's channels).
//
//   gradsync-gpu-ipc-floor [--round-trips N]
// Prints "ipc_floor: mode=processes p50_us=... p99_us=..." and the same for mode=threads.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/gpu/busy_kernel.h"

namespace {

using Clock = std::chrono::steady_clock;

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "ipc_floor: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// One direction of the signalling: a file descriptor pair (a pipe, in either mode).
struct Pipe {
  int fd[2] = {-1, -1};
  bool open() { return pipe(fd) == 0; }
  ~Pipe() {
    for (int f : fd) if (f >= 0) close(f);
  }
  // Closes one end (0: read, 1: write): after a fork, each process closes the ends it does not
  // use, so that a side that fails or exits gives the other an end of file, not a hang.
  void close_end(int end) {
    if (fd[end] >= 0) close(fd[end]);
    fd[end] = -1;
  }
  bool send(const void* data, size_t n) const { return write(fd[1], data, n) == static_cast<ssize_t>(n); }
  bool receive(void* data, size_t n) const {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = read(fd[0], static_cast<char*>(data) + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
};

bool poll(cudaEvent_t event) {
  for (;;) {
    const cudaError_t r = cudaEventQuery(event);
    if (r == cudaSuccess) return true;
    if (r != cudaErrorNotReady) return ok(r, "cudaEventQuery");
    (void)cudaGetLastError();
  }
}

cudaEvent_t interprocess_event() {
  cudaEvent_t e = nullptr;
  ok(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return e;
}

// The daemon's side: `to_trainer` carries its event's handle first, then one byte per round.
int daemon_role(const Pipe& from_trainer, const Pipe& to_trainer, int rounds, bool same_process,
                cudaEvent_t shared_ready) {
  if (!ok(cudaSetDevice(0), "cudaSetDevice")) return 1;
  cudaStream_t stream = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) return 1;
  cudaEvent_t ready = shared_ready;
  if (!same_process) {
    cudaIpcEventHandle_t handle;
    if (!from_trainer.receive(&handle, sizeof handle)) return 1;
    if (!ok(cudaIpcOpenEventHandle(&ready, handle), "cudaIpcOpenEventHandle")) return 1;
  }
  cudaEvent_t done = interprocess_event();
  if (same_process) {  // an event is not opened through IPC in the process that made it
    if (!to_trainer.send(&done, sizeof done)) return 1;
  } else {
    cudaIpcEventHandle_t handle;
    if (!ok(cudaIpcGetEventHandle(&handle, done), "cudaIpcGetEventHandle")) return 1;
    if (!to_trainer.send(&handle, sizeof handle)) return 1;
  }
  for (int i = 0; i < rounds; ++i) {
    char seq = 0;
    if (!from_trainer.receive(&seq, 1) || !poll(ready)) return 1;
    if (!gradsync::bench::launch_spin(0, stream)) return 1;  // one tiny kernel, as the bucket's
    if (!ok(cudaEventRecord(done, stream), "cudaEventRecord") || !to_trainer.send(&seq, 1)) return 1;
  }
  return 0;
}

// The trainer's side: returns the round trips in microseconds (empty on a failure).
std::vector<double> trainer_role(const Pipe& to_daemon, const Pipe& from_daemon, int rounds, cudaEvent_t ready,
                                 bool same_process) {
  cudaStream_t stream = nullptr;
  if (!ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) return {};
  if (!same_process) {
    cudaIpcEventHandle_t handle;
    if (!ok(cudaIpcGetEventHandle(&handle, ready), "cudaIpcGetEventHandle") || !to_daemon.send(&handle, sizeof handle)) {
      return {};
    }
  }
  cudaEvent_t done = nullptr;
  if (same_process) {
    if (!from_daemon.receive(&done, sizeof done)) return {};
  } else {
    cudaIpcEventHandle_t handle;
    if (!from_daemon.receive(&handle, sizeof handle)) return {};
    if (!ok(cudaIpcOpenEventHandle(&done, handle), "cudaIpcOpenEventHandle")) return {};
  }
  std::vector<double> us;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    char seq = static_cast<char>(i);
    if (!ok(cudaEventRecord(ready, stream), "cudaEventRecord") || !to_daemon.send(&seq, 1)) return {};
    if (!from_daemon.receive(&seq, 1) || !poll(done)) return {};
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return us;
}

void report(const char* mode, std::vector<double> us) {
  const size_t warm = std::min<size_t>(20, us.size() / 10);
  us.erase(us.begin(), us.begin() + static_cast<long>(warm));
  std::sort(us.begin(), us.end());
  const auto at = [&](double p) { return us[std::min(us.size() - 1, static_cast<size_t>(p * static_cast<double>(us.size())))]; };
  std::printf("ipc_floor: mode=%s p50_us=%.1f p99_us=%.1f\n", mode, at(0.5), at(0.99));
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 500;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--round-trips") == 0 && i + 1 < argc) {
      rounds = std::max(20, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: gradsync-gpu-ipc-floor [--round-trips N]\n");
      return 2;
    }
  }
  // Two processes: the fork comes before either touches CUDA.
  {
    Pipe down, up;
    if (!down.open() || !up.open()) return 1;
    const pid_t child = fork();
    if (child == 0) {
      down.close_end(1);
      up.close_end(0);
      _exit(daemon_role(down, up, rounds, false, nullptr));
    }
    down.close_end(0);
    up.close_end(1);
    if (!ok(cudaSetDevice(0), "cudaSetDevice")) return 1;
    std::vector<double> us = trainer_role(down, up, rounds, interprocess_event(), false);
    down.close_end(1);  // a daemon still reading sees the end
    int status = 0;
    waitpid(child, &status, 0);
    if (us.empty() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "ipc_floor: the two-process run failed\n");
      return 1;
    }
    report("processes", us);
  }
  // Two threads, one context.
  {
    Pipe down, up;
    if (!down.open() || !up.open()) return 1;
    const cudaEvent_t ready = interprocess_event();
    int daemon_rc = 1;
    std::thread daemon([&] {
      daemon_rc = daemon_role(down, up, rounds, true, ready);
      up.close_end(1);  // a trainer still reading sees the end
    });
    const std::vector<double> us = trainer_role(down, up, rounds, ready, true);
    down.close_end(1);
    daemon.join();
    if (us.empty() || daemon_rc != 0) {
      std::fprintf(stderr, "ipc_floor: the two-thread run failed\n");
      return 1;
    }
    report("threads", us);
  }
  return 0;
}
