// gradsyncd's main(): parse the configuration once, build the Daemon, run it.
#include "daemon/daemon_main.h"

#include <malloc.h>

#include <google/protobuf/stubs/logging.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>

#include "daemon/config/config.h"
#include "daemon/daemon.h"

namespace gradsync {

int daemon_main(int argc, char** argv) {
  // glibc raises its mmap and trim thresholds each time a large block is freed (up to 32 and
  // 64 MiB), after which a thread arena keeps that much freed memory for good: one large
  // registration would leave the daemon tens of MB larger. Fixed thresholds keep it returning
  // memory: blocks from 1 MiB are mapped on their own, and an arena's free top beyond 1 MiB is
  // given back.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 20);
  // One arena for every thread: with a thread arena per setup thread, a decoded registration's
  // million small blocks sometimes stayed in one (about 60 MiB, measured in about one run in
  // three) where malloc_trim did not return them. The per-step path allocates little (an
  // operation's bookkeeping), and each thread's tcache serves small blocks without the lock.
  ::mallopt(M_ARENA_MAX, 1);
  // protobuf prints its own line to stderr for every string field that is not UTF-8: a hostile
  // client could fill the journal with them. The daemon's refusal (naming the request) is
  // logged and answered already.
  google::protobuf::SetLogHandler(nullptr);
  ParsedConfig parsed = parse_daemon_config(argc, argv);
  if (!parsed.config) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  // Starting: any failure, a Error or not (a thread that cannot be started), is
  // reported and unwinds, so that the sockets and the folders made for them go. Running: an
  // exception that is not a Error is a defect, and aborts with its core dump.
  std::optional<Daemon> daemon;
  try {
    // SIGHUP reads the same flags and configuration file again.
    daemon.emplace(*parsed.config, [argc, argv] { return parse_daemon_config(argc, argv); },
                   TestHooks::from_environment());
  } catch (const Error& e) {
    std::fprintf(stderr, "gradsyncd: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsyncd: cannot start: %s\n", e.what());
    return 1;
  }
  try {
    const int status = daemon->run();
    const bool undrained = daemon->keeps_undrained_gpu_memory();
    if (status == Daemon::kExitGpuLost || undrained) {
      // The CUDA context on a GPU is broken, or GPU work that never drained may still touch
      // memory the daemon kept mapped for it: tearing down NCCL and CUDA (unmapping that memory)
      // could hang or fault the GPU, and the process's end releases it all. The jobs were
      // failed and the rest drained already.
      if (undrained) {
        std::fprintf(stderr, "gradsyncd: exiting without tearing down: GPU work of a failed job never drained\n");
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(status);
    }
    return status;
  } catch (const Error& e) {
    std::fprintf(stderr, "gradsyncd: %s\n", e.what());
    return 1;
  }
}

}  // namespace gradsync
