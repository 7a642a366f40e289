// The bench's second peer: Open MPI's MPI_Allreduce of float32 in place over shared memory,
// run by mpirun (gradsync-bench starts it: mpi_peer.h). Every rank holds `--bytes` of 1.0f;
// each timed step is a barrier and one MPI_Allreduce (MPI_SUM); rank 0 prints "sample <us>"
// per timed step, after two untimed ones, and checks that every element is the world size.
//
//   mpirun -np N gradsync-mpi-peer --bytes B --steps S
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  size_t bytes = 4096;
  int steps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const size_t count = bytes / sizeof(float);
  std::vector<float> data(count);
  int bad = 0;
  for (int s = 0; s < steps + 2; ++s) {
    std::fill(data.begin(), data.end(), 1.0f);  // the same values every step: the sum is exact
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    for (size_t i = 0; i < count; i += 1024) bad += data[i] != static_cast<float>(size);
    if (rank == 0 && s >= 2) std::printf("sample %.3f\n", us);
  }
  if (bad) std::fprintf(stderr, "rank %d: %d wrong elements\n", rank, bad);
  std::fflush(stdout);
  MPI_Finalize();
  return bad ? 1 : 0;
}
