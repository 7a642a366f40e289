// A registration's tensors may not share bytes (daemon/control/registration_check.h), however
// they are ordered, and empty tensors own none.
#include <catch2/catch.hpp>

#include "daemon/control/registration_check.h"

namespace gradsync {

TEST_CASE("registration check: an overlap is found past an empty or short tensor between", "[registration]") {
  std::byte memory[4096];
  const auto f32 = [](uint64_t numel) { return plan::TensorLayout{DType::kFloat32, numel, "dp"}; };
  // A (bytes 0-255), B (empty, at 8), C (bytes 16-79): A and C overlap.
  CHECK_THAT(check_no_overlap({f32(64), f32(0), f32(16)}, {memory, memory + 8, memory + 16}).message(),
             Catch::Contains("tensor 2 overlaps tensor 0"));
  // A (0-255), B (16-19), C (32-95): B hides nothing; A overlaps both.
  CHECK_FALSE(check_no_overlap({f32(64), f32(1), f32(16)}, {memory, memory + 16, memory + 32}).ok());
  // Two tensors at one address.
  CHECK_FALSE(check_no_overlap({f32(4), f32(4)}, {memory, memory}).ok());
  // Back to back, and empty ones anywhere: fine.
  CHECK(check_no_overlap({f32(4), f32(0), f32(4), f32(0)}, {memory, memory + 8, memory + 16, memory}).ok());
}

}  // namespace gradsync
