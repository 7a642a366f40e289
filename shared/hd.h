// GRADSYNC_HD marks a function that runs on the host and, compiled by nvcc, on the device too.
// The reduction arithmetic (half conversions, combine, the CUDA backend's gather and scatter
// functors) is written once this way, so the host unit tests check the very code the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define GRADSYNC_HD __host__ __device__
#else
#define GRADSYNC_HD
#endif
