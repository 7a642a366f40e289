// Leveled logging to stderr (journald picks it up under systemd). A Logger is a small value
// passed down to the components that log; there is no global logger. Every line carries a
// context prefix so operators can tell which job, rank or client it is about:
//   2026-11-29T14:03:12.123Z W gradsyncd: job=resnet rank=2: client pid 4242 disconnected
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace gradsync {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning", "error"; false when unknown.
bool parse_log_level(std::string_view text, LogLevel* level);
std::string_view log_level_name(LogLevel level);

// A log message is cut at this size (safe_text.h says how much was cut).
inline constexpr size_t kMaxLogMessageBytes = 4096;

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kInfo, std::string context = "gradsyncd")
      : level_(std::make_shared<std::atomic<LogLevel>>(level)), context_(std::move(context)) {}

  // A logger whose lines also carry `more` (e.g. "job=resnet"). It shares this one's level.
  Logger with(std::string_view more) const { return Logger(level_, context_ + " " + std::string(more)); }

  // Changes the level of this logger and of every one derived from it or copied (SIGHUP).
  void set_level(LogLevel level) const { level_->store(level); }
  LogLevel level() const { return level_->load(); }

  bool enabled(LogLevel level) const { return level >= level_->load(std::memory_order_relaxed); }
  void log(LogLevel level, std::string_view message) const;
  void debug(std::string_view m) const { log(LogLevel::kDebug, m); }
  void info(std::string_view m) const { log(LogLevel::kInfo, m); }
  void warning(std::string_view m) const { log(LogLevel::kWarning, m); }
  void error(std::string_view m) const { log(LogLevel::kError, m); }

 private:
  Logger(std::shared_ptr<std::atomic<LogLevel>> level, std::string context)
      : level_(std::move(level)), context_(std::move(context)) {}

  std::shared_ptr<std::atomic<LogLevel>> level_;  // shared by copies and derived loggers
  std::string context_;
};

// One line a second at most for a message a flood repeats (a refused connection): the first
// is written at once; those within the next second are counted, and the next line written says
// how many were left out. One thread only.
class LogThrottle {
 public:
  void note(const Logger& log, LogLevel level, const std::string& message);

 private:
  std::chrono::steady_clock::time_point last_;
  size_t left_out_ = 0;
};

}  // namespace gradsync
