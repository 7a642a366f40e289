// Comparing the layouts that different ranks registered. Every rank of a job must register
// the same tensors (dtype, element count, group, in the same order); otherwise element i of
// one rank would be reduced with unrelated data of another.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "daemon/plan/planner.h"

namespace gradsync::plan {

// nullopt when equal. Otherwise a message naming the first difference and both ranks, e.g.
//   "tensor 12 differs: rank 0 has float32[1024] in group 'dp', rank 2 has float32[2048] in group 'dp'"
//   "rank 0 registered 161 tensors, rank 3 registered 160"
std::optional<std::string> first_difference(std::span<const TensorLayout> a, int rank_a,
                                            std::span<const TensorLayout> b, int rank_b);

// A 64-bit digest of a layout (order-sensitive), for comparing layouts across nodes without
// shipping them. Equal layouts give equal fingerprints on every platform.
uint64_t fingerprint(std::span<const TensorLayout> layout);

// "float32[1024] in group 'dp'"
std::string describe(const TensorLayout& tensor);

}  // namespace gradsync::plan
