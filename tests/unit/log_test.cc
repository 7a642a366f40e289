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

#include "daemon/util/safe_text.h"

namespace gradsync {

TEST_CASE("safe text: control bytes and broken UTF-8 escaped, valid UTF-8 kept, long text cut saying how much",
          "[log]") {
  CHECK(safe_text("plain text", 100) == "plain text");
  CHECK(safe_text("two\nlines\x1b[31m", 100) == "two\\x0alines\\x1b[31m");
  CHECK(safe_text("caf\xc3\xa9 \xff", 100) == "caf\xc3\xa9 \\xff");
  // Valid UTF-8 that acts: C1 NEL and CSI, the line separator, a right-to-left override and an
  // isolate are escaped; other characters beyond ASCII (U+00A0, U+2027, U+202F) are kept.
  CHECK(safe_text("a\xc2\x85" "b\xc2\x9b" "31m", 100) == "a\\u0085b\\u009b31m");
  CHECK(safe_text("x\xe2\x80\xa8y\xe2\x80\xa9", 100) == "x\\u2028y\\u2029");
  CHECK(safe_text("job\xe2\x80\xae" "gnp.exe\xe2\x81\xa6", 100) == "job\\u202egnp.exe\\u2066");
  CHECK(safe_text("\xc2\xa0\xe2\x80\xa7\xe2\x80\xaf", 100) == "\xc2\xa0\xe2\x80\xa7\xe2\x80\xaf");
  CHECK(safe_text(std::string(5000, 'a'), 100) == std::string(100, 'a') + " ... (4900 more bytes)");
}

}  // namespace gradsync
