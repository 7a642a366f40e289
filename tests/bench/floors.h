// The physical floors the benchmark measures gradsync against, in the same run, with code in
// the project (no outside files):
//   memory_floor   an in-place N-way reduction done directly on private memory by T threads:
//                  read N*S bytes, write N*S bytes, the least any shared-memory all-reduce moves
//                  (a reduce-scatter's: read N*S, write S); each run the faster of plain and
//                  streaming stores
//   wakeup         a cross-process round trip as two processes spinning on one shared cache
//                  line see it (the least any two processes can meet in), and, as references,
//                  through a futex in shared memory and through a pipe
//   gloo_alone     Gloo's allreduce between P processes on loopback in the slices and with the
//                  algorithm gradsync's engine uses, without gradsync: the cross-node stage alone;
//                  optionally with each process also doing the least local work of a node (the
//                  memory floor over its clients' buffers) at the same time, on the same CPUs
#pragma once

#include <cstddef>
#include <string>

#include "tests/bench/report.h"

namespace gradsync::bench {

// Milliseconds per pass: the best of `runs` runs (one sample). `scatter`: the reduce-scatter floor (read N x S,
// write S) instead of the all-reduce's (read N x S, write N x S).
Measurement memory_floor(int clients, size_t bytes_per_client, int threads, int runs, bool scatter = false);

struct Wakeup {
  Measurement spin_us;   // one sample per round trip; the floor
  Measurement futex_us;
  Measurement pipe_us;
};
Wakeup wakeup_floor(int rounds);

// Milliseconds per allreduce of `bytes` of float32 between `processes` processes (children
// running this binary with --role gloo-floor), in Gloo calls of `slice` bytes, one sample per
// step of rank 0; and the CPU time all ranks together used per timed step (negative if unknown).
struct GlooFloor {
  Measurement ms;
  double cpu_ms_per_step = -1;
};
//
// With local.clients > 0 each rank is a whole node's floor: during every step it also runs the
// memory floor's in-place reduction over `clients` buffers of `bytes` on `threads` threads,
// beside its Gloo calls, and the step ends when both have. Where the nodes share this machine's
// CPUs (loopback), that is about the least a hierarchical allreduce (local reduce, Gloo between
// nodes, local fan-out) can take here: the network stage and the least local memory traffic,
// each as measured alone, perfectly overlapped. Not a strict bound: Gloo works on a buffer of
// its own here, so an implementation that fused the stages (Gloo sending sums still in cache)
// could move a little less.
struct LocalWork {
  int clients = 0;
  int threads = 1;
};
GlooFloor gloo_alone(const std::string& self, int processes, size_t bytes, size_t slice, int steps,
                     const LocalWork& local = {});

// The child side of gloo_alone: one rank. Rank 0 prints "sample <ms>" per timed step; every rank
// prints "cpu <ms>", its own CPU time per timed step. `host`: the address its Gloo pairs bind
// (loopback here; a node's own address in the simulated cluster, tests/cluster).
int run_gloo_rank(const std::string& store_dir, int rank, int size, size_t bytes, size_t slice, int steps,
                  const LocalWork& local, const std::string& host = "127.0.0.1");

}  // namespace gradsync::bench
