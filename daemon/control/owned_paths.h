// What gradsyncd puts on the filesystem for its sockets, and takes away again: the socket file
// it bound and the folders it created for it. Each is removed only while it is still the one
// made here (same device and inode), so a stopping daemon never removes what another process
// has put at the path since, and nothing is removed after a SIGKILL or a crash (the next start
// replaces a stale socket; socket_path.h).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace gradsync {

// A file or folder as it was when recorded (device and inode; a final symlink is not followed).
struct PathIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  bool valid = false;  // false: nothing was there to record

  static PathIdentity of(const std::string& path);
  bool still_at(const std::string& path) const;
};

// The socket file a server bound. remove() (idempotent; also on destruction) unlinks it if it is
// still the one bound here. Call it while the socket still listens: until then, a daemon
// starting on the same path finds it served and refuses, so the path cannot change hands (and
// a freed inode number cannot come back as a newcomer's socket) before it is checked.
class SocketFile {
 public:
  SocketFile() = default;
  ~SocketFile() { remove(); }
  SocketFile(const SocketFile&) = delete;
  SocketFile& operator=(const SocketFile&) = delete;

  // Records the file now at `path`: call right after bind().
  void bound(std::string path);
  void remove();

 private:
  std::string path_;
  PathIdentity identity_;
};

// The folders created for a socket (check_socket_folder). When this goes (the daemon stops, or
// fails to start after making them), each is removed, deepest first, if it is empty and still
// the folder made here: a file someone put there, or another daemon's socket, keeps it.
class CreatedFolders {
 public:
  CreatedFolders() = default;
  ~CreatedFolders();
  CreatedFolders(const CreatedFolders&) = delete;
  CreatedFolders& operator=(const CreatedFolders&) = delete;

  void add(std::filesystem::path folder);

 private:
  std::vector<std::pair<std::filesystem::path, PathIdentity>> folders_;  // outermost first
};

}  // namespace gradsync
