// Where gradsyncd may put a Unix socket (the control socket, the admin socket) so that no other
// user can squat it or swap it: the socket's folder must belong to gradsyncd's user or root and
// be writable by nobody else, and so must every folder above it, except that a folder above may
// be world-writable with the sticky bit (like /tmp), which keeps others from renaming what is
// not theirs. A folder that does not exist is created, owned by gradsyncd, mode 0755.
//
// The socket itself gets its mode before it has a name: bind_unix_socket() sets the socket's
// mode with fchmod, which Linux gives the file that bind() creates, so the socket is never more
// open than intended, not even for a moment.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "shared/status.h"

namespace gradsync {

// A file or folder as it was when recorded (device and inode, not following a final symlink):
// what gradsyncd made is removed only while it is still the same one, never what another
// process has put at the path since (a daemon started on the same path while this one stops).
struct PathIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  bool valid = false;

  static PathIdentity of(const std::string& path);
  bool still_at(const std::string& path) const;
};

// Unlinks `path` if it is still `identity` (a socket this daemon bound).
void remove_if_still(const std::string& path, const PathIdentity& identity);

// The folders check_socket_folder() created for a socket. When this goes (the daemon stops, or
// fails to start after making them), each is removed, deepest first, if it is empty and still
// the folder made here: gradsyncd leaves behind no folder it made, and removes nothing it did
// not make or that holds something (another socket, a file someone put there). A daemon that
// is killed (SIGKILL, a crash) leaves them.
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

// Checks (and creates, if missing) the folder of `socket_path`; the error names the folder,
// its owner or mode, and what to do. `what` names the socket in messages ("control socket").
// Missing folders are made only under a folder that passes the same checks, and are added to
// `created`.
Status check_socket_folder(const std::string& socket_path, const std::string& what, CreatedFolders& created);

// A listening Unix socket at `path` with `mode`, created without a window in which it has
// another mode; the descriptor, or -1 with *status set.
int bind_unix_socket(const std::string& path, mode_t mode, int backlog, bool nonblocking, Status* status);

}  // namespace gradsync
