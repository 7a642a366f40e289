// Logger: copies and derived loggers share one level, so SIGHUP's change reaches every job's.
#include <catch2/catch.hpp>

#include "daemon/util/log.h"

namespace gradsync {

TEST_CASE("log: a level set on a logger reaches its copies and the loggers derived from it", "[log]") {
  Logger daemon(LogLevel::kInfo);
  const Logger job = daemon.with("job=resnet");
  const Logger copy = job;
  CHECK(job.enabled(LogLevel::kInfo));
  daemon.set_level(LogLevel::kError);
  CHECK_FALSE(job.enabled(LogLevel::kInfo));
  CHECK_FALSE(copy.enabled(LogLevel::kWarning));
  CHECK(copy.enabled(LogLevel::kError));
  copy.set_level(LogLevel::kDebug);
  CHECK(daemon.enabled(LogLevel::kDebug));
  CHECK(log_level_name(daemon.level()) == "debug");
  // A new logger has its own level.
  Logger other(LogLevel::kWarning);
  CHECK_FALSE(other.enabled(LogLevel::kInfo));
}

}  // namespace gradsync
