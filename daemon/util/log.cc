#include "daemon/util/log.h"

#include "daemon/util/safe_text.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace gradsync {

bool parse_log_level(std::string_view text, LogLevel* level) {
  if (text == "debug") *level = LogLevel::kDebug;
  else if (text == "info") *level = LogLevel::kInfo;
  else if (text == "warning") *level = LogLevel::kWarning;
  else if (text == "error") *level = LogLevel::kError;
  else return false;
  return true;
}

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

void Logger::log(LogLevel level, std::string_view raw) const {
  if (!enabled(level)) return;
  // Messages carry client-chosen text: one line each, bounded, whatever a client sent.
  const std::string message = safe_text(raw, kMaxLogMessageBytes);
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  std::string line;
  line.reserve(64 + context_.size() + message.size());
  line.append(stamp).append(".").append(std::to_string(1000 + millis).substr(1)).append("Z ");
  line.push_back(kLetters[static_cast<int>(level)]);
  line.append(" ").append(context_).append(": ").append(message).append("\n");
  // One write per line so lines from different threads never interleave.
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

void LogThrottle::note(const Logger& log, LogLevel level, const std::string& message) {
  const auto now = std::chrono::steady_clock::now();
  if (last_ != std::chrono::steady_clock::time_point{} && now - last_ < std::chrono::seconds(1)) {
    ++left_out_;
    return;
  }
  log.log(level, left_out_ == 0 ? message
                                : message + " (and " + std::to_string(left_out_) + " more like it not logged)");
  last_ = now;
  left_out_ = 0;
}

}  // namespace gradsync
