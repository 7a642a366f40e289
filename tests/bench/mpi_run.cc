#include "tests/bench/mpi_run.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "client/tools/process.h"
#include "tests/bench/sampled.h"

namespace gradsync::bench {
namespace {

// Open MPI 4.1's names for coll_tuned_allreduce_algorithm's values.
constexpr const char* kAlgorithms[] = {"default", "basic linear", "nonoverlapping", "recursive doubling",
                                       "ring", "segmented ring", "rabenseifner"};

// One mpirun of the peer; `algorithm` 0 leaves Open MPI's own choice.
Measurement run(const std::string& peer, int ranks, size_t bytes, int steps, int algorithm) {
  // shared memory only (vader), as many ranks as asked on this one machine, bounded in time.
  std::string command = "timeout --foreground -k 5 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np " +
                        std::to_string(ranks) + " --mca btl self,vader";
  if (algorithm > 0) {
    command += " --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm " + std::to_string(algorithm);
  }
  command += " '" + peer + "' --bytes " + std::to_string(bytes) + " --steps " + std::to_string(steps) + " 2>&1";
  return sampled(command);
}

}  // namespace

MpiPeer mpi_peer(int ranks, size_t bytes, int steps) {
  MpiPeer peer;
  const std::string binary = executable_directory() + "/gradsync-mpi-peer";
  if (::access(binary.c_str(), X_OK) != 0 || std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    const std::string why = "Open MPI is not installed (openmpi-bin, libopenmpi-dev; then rebuild)";
    peer.by_default = peer.best_tuned = skipped(why);
    peer.tuned_note = why;
    return peer;
  }
  peer.by_default = run(binary, ranks, bytes, steps, 0);
  peer.best_tuned = skipped("no tuned algorithm ran");
  std::string failed;
  for (int a = 1; a <= 6; ++a) {
    Measurement m = run(binary, ranks, bytes, steps, a);
    if (!m.ok()) {
      failed += (failed.empty() ? "" : ", ") + std::to_string(a);
      continue;
    }
    if (!peer.best_tuned.ok() || m.median() < peer.best_tuned.median()) {
      peer.best_tuned = std::move(m);
      peer.best_algorithm = a;
    }
  }
  peer.tuned_note = peer.best_algorithm > 0 ? "best tuned: algorithm " + std::to_string(peer.best_algorithm) + " (" +
                                                  kAlgorithms[peer.best_algorithm] + ") of 1-6"
                                            : "no tuned algorithm ran";
  if (!failed.empty()) peer.tuned_note += "; algorithms " + failed + " failed";
  return peer;
}

}  // namespace gradsync::bench
