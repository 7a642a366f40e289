#include "daemon/job/job_settings.h"

#include <charconv>
#include <sstream>

namespace gradsync {

void JobSettings::merge(const JobSettings& later) {
  if (later.bucket_cap) bucket_cap = later.bucket_cap;
  if (later.timeout) timeout = later.timeout;
  if (later.execution_timeout) execution_timeout = later.execution_timeout;
}

std::string JobSettings::describe() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  if (bucket_cap) add("bucket cap " + std::to_string(*bucket_cap) + " bytes");
  if (timeout) add("timeout " + std::to_string(timeout->count()) + " ms");
  if (execution_timeout) add("execution timeout " + std::to_string(execution_timeout->count()) + " ms");
  return out.empty() ? "no change" : out;
}

std::string JobSettings::invalid() const {
  auto bad = [](const std::optional<std::chrono::milliseconds>& v) {
    return v && (v->count() <= 0 || *v > kMaxBound);
  };
  if (bad(timeout)) return "timeout_ms must be from 1 to 86400000 (a day), not " + std::to_string(timeout->count());
  if (bad(execution_timeout)) {
    return "execution_timeout_ms must be from 1 to 86400000 (a day), not " + std::to_string(execution_timeout->count());
  }
  return {};
}

std::string JobSettings::encode() const {
  std::string out = "v1";
  if (bucket_cap) out += " cap=" + std::to_string(*bucket_cap);
  if (timeout) out += " timeout=" + std::to_string(timeout->count());
  if (execution_timeout) out += " exec=" + std::to_string(execution_timeout->count());
  return out;
}

bool JobSettings::decode(const std::string& text, JobSettings* out) {
  std::istringstream in(text);
  std::string word;
  if (!(in >> word) || word != "v1") return false;
  JobSettings s;
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) return false;
    uint64_t value = 0;
    const char* first = word.data() + eq + 1;
    const char* last = word.data() + word.size();
    if (auto [end, ec] = std::from_chars(first, last, value); ec != std::errc() || end != last) return false;
    const std::string key = word.substr(0, eq);
    if (key == "cap") {
      s.bucket_cap = value;
    } else if (key == "timeout") {
      s.timeout = std::chrono::milliseconds(value);
    } else if (key == "exec") {
      s.execution_timeout = std::chrono::milliseconds(value);
    } else {
      return false;
    }
  }
  if (!s.invalid().empty()) return false;
  *out = s;
  return true;
}

}  // namespace gradsync
