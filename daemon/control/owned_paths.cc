#include "daemon/control/owned_paths.h"

#include <sys/stat.h>
#include <unistd.h>

namespace gradsync {

PathIdentity PathIdentity::of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return PathIdentity{};
  return PathIdentity{st.st_dev, st.st_ino, true};
}

bool PathIdentity::still_at(const std::string& path) const {
  const PathIdentity now = of(path);
  return valid && now.valid && now.device == device && now.inode == inode;
}

void SocketFile::bound(std::string path) {
  path_ = std::move(path);
  identity_ = PathIdentity::of(path_);
}

void SocketFile::remove() {
  if (identity_.still_at(path_)) ::unlink(path_.c_str());
  identity_ = PathIdentity{};
}

void CreatedFolders::add(std::filesystem::path folder) {
  const PathIdentity identity = PathIdentity::of(folder);
  if (identity.valid) folders_.push_back({std::move(folder), identity});
}

CreatedFolders::~CreatedFolders() {
  // rmdir leaves a folder that holds anything.
  for (auto it = folders_.rbegin(); it != folders_.rend(); ++it) {
    if (it->second.still_at(it->first)) ::rmdir(it->first.c_str());
  }
}

}  // namespace gradsync
