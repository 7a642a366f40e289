// gradsyncd's configuration: parsed once, from flags and an optional config file, into one
// struct that the Daemon passes down. Nothing below main() reads flags or the environment.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "daemon/util/log.h"

namespace gradsync {

struct DaemonConfig {
  std::string socket_path = "/run/gradsync/gradsync.sock";
  // Bound for every wait of a job (registration barrier, a step's stragglers) unless the job
  // asks for its own, which is capped at max_timeout.
  std::chrono::milliseconds default_timeout{30'000};
  std::chrono::milliseconds max_timeout{600'000};
  size_t reduce_threads = 0;  // 0: one per hardware thread
  LogLevel log_level = LogLevel::kInfo;
  // Users whose processes may connect, checked with SO_PEERCRED. Empty: the daemon's own user
  // and root.
  std::vector<uid_t> allowed_uids;
};

// Outcome of parsing: either a config, or text to print and an exit code (--help, --version,
// or an error naming the bad option).
struct ParsedConfig {
  std::optional<DaemonConfig> config;
  std::string message;
  int exit_code = 0;
};

ParsedConfig parse_daemon_config(int argc, const char* const* argv);

}  // namespace gradsync
