#include "daemon/test_hooks.h"

#include <cstdlib>

namespace gradsync {
namespace {

std::optional<std::chrono::milliseconds> milliseconds_from(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::chrono::milliseconds(std::atoll(value));
}

}  // namespace

TestHooks TestHooks::from_environment() {
  TestHooks hooks;
  hooks.gpu_lost_after = milliseconds_from("GRADSYNCD_TEST_GPU_LOST_AFTER_MS");
  hooks.hang_io_after = milliseconds_from("GRADSYNCD_TEST_HANG_IO_AFTER_MS");
  if (const char* op = std::getenv("GRADSYNCD_TEST_CORRUPT_RESULT_AT_OP"); op != nullptr && *op != '\0') {
    hooks.corrupt_result_at_op = std::strtoull(op, nullptr, 10);
  }
  if (const char* op = std::getenv("GRADSYNCD_TEST_FAIL_ALLOC_AT_OP"); op != nullptr && *op != '\0') {
    hooks.fail_alloc_at_op = std::strtoull(op, nullptr, 10);
  }
  return hooks;
}

}  // namespace gradsync
