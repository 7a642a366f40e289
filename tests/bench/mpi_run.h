// Open MPI's MPI_Allreduce as the bench's second peer (gradsync-mpi-peer under mpirun, over
// shared memory): with its default algorithm, and the best of its tuned ones
// (coll_tuned_allreduce_algorithm 1 to 6, each run on its own), in microseconds per step.
// Skipped, saying why, where Open MPI or the peer binary is not installed.
#pragma once

#include <cstddef>
#include <string>

#include "tests/bench/report.h"

namespace gradsync::bench {

struct MpiPeer {
  Measurement by_default;
  Measurement best_tuned;
  int best_algorithm = 0;  // 0: none measured
  std::string tuned_note;  // "algorithm 4 (ring) of 1-6", or why not
};

MpiPeer mpi_peer(int ranks, size_t bytes, int steps);

}  // namespace gradsync::bench
