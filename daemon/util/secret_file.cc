#include "daemon/util/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace gradsync {

Status read_secret_file(const std::string& path, const std::string& flag, size_t max_bytes, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::invalid_argument(flag + ": cannot read '" + path + "': " + std::strerror(errno));
  struct stat st {};
  const bool examined = ::fstat(fd, &st) == 0;
  std::string text;
  char buffer[4096];
  ssize_t got = 0;
  while (examined && S_ISREG(st.st_mode) && text.size() <= max_bytes &&
         (got = ::read(fd, buffer, sizeof buffer)) > 0) {
    text.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  if (!examined || !S_ISREG(st.st_mode)) return Status::invalid_argument(flag + ": '" + path + "' is not a regular file");
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return Status::invalid_argument(flag + ": '" + path + "' belongs to uid " + std::to_string(st.st_uid) +
                                    ", not to root or gradsyncd's user");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    return Status::invalid_argument(flag + ": '" + path + "' can be read by other users (chmod 600 it)");
  }
  if (text.size() > max_bytes) {
    return Status::invalid_argument(flag + ": '" + path + "' holds more than " + std::to_string(max_bytes) + " bytes");
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  *out = std::move(text);
  return Status();
}

Status read_config_file(const std::string& path, const std::string& flag, std::string* out) {
  // A folder opens as a stream that reads nothing, which would pass for an empty file.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::invalid_argument(flag + ": cannot read '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return Status::invalid_argument(flag + ": '" + path + "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return Status::invalid_argument(flag + ": cannot read '" + path + "'");
  *out = text.str();
  return Status();
}

}  // namespace gradsync
