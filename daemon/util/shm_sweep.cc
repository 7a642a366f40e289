#include "daemon/util/shm_sweep.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "shared/shm_segment.h"

namespace gradsync {
namespace {

// The creator's pid in "gradsync-<tag>-<pid>-...", or 0 when the name has another shape.
pid_t creator_of(const std::string& name) {
  if (!ShmSegment::valid_name(name)) return 0;
  const size_t tag_end = name.find('-', sizeof("gradsync-") - 1);
  if (tag_end == std::string::npos) return 0;
  const char* digits = name.c_str() + tag_end + 1;
  char* end = nullptr;
  const long pid = std::strtol(digits, &end, 10);
  if (end == digits || *end != '-' || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

}  // namespace

size_t sweep_stale_segments(const std::string& directory) {
  size_t removed = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(directory, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const pid_t pid = creator_of(name);
    if (pid == 0) continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // the creator lives (or is not ours to judge)
    if (::unlink(it->path().c_str()) == 0) removed++;
  }
  return removed;
}

}  // namespace gradsync
