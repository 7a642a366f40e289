// Faults a test asks the real gradsyncd binary to act out where the machine cannot produce
// them: a GPU lost on a machine without one, an io thread that hangs (what the systemd
// watchdog must catch). The Daemon is given them as a value and arms them once it serves; it
// reads no environment itself. Production passes none.
#pragma once

#include <chrono>
#include <optional>

namespace gradsync {

struct TestHooks {
  // Reports GPU 0 lost (a sticky CUDA error's path: drain, exit status 75) this long after
  // the daemon is ready.
  std::optional<std::chrono::milliseconds> gpu_lost_after;
  // Blocks the io thread for good this long after the daemon is ready.
  std::optional<std::chrono::milliseconds> hang_io_after;
  // Flips a byte of this node's reduced copy of the cross-node buckets of the operation with
  // this sequence number, for the integrity check (--integrity-check-every) to find.
  std::optional<uint64_t> corrupt_result_at_op;
  // Throws std::bad_alloc from a reduction task (a pool thread's, where there is one) of this
  // node's cross-node buckets of the operation with this sequence number: memory running out.
  std::optional<uint64_t> fail_alloc_at_op;

  // From $GRADSYNCD_TEST_GPU_LOST_AFTER_MS, $GRADSYNCD_TEST_HANG_IO_AFTER_MS,
  // $GRADSYNCD_TEST_CORRUPT_RESULT_AT_OP and $GRADSYNCD_TEST_FAIL_ALLOC_AT_OP, read once by
  // gradsyncd's main(): how the integration tests reach the real binary.
  static TestHooks from_environment();
};

}  // namespace gradsync
