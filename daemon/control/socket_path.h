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
#include <vector>

#include "shared/status.h"

namespace gradsync {

// The folders check_socket_folder() created for a socket. When this goes (the daemon stops, or
// fails to start after making them), each is removed, deepest first, if it is empty: gradsyncd
// leaves behind no folder it made, and never removes anything it did not make or that holds
// something (another socket, a file someone put there).
class CreatedFolders {
 public:
  CreatedFolders() = default;
  ~CreatedFolders();
  CreatedFolders(const CreatedFolders&) = delete;
  CreatedFolders& operator=(const CreatedFolders&) = delete;

  void add(std::filesystem::path folder) { folders_.push_back(std::move(folder)); }

 private:
  std::vector<std::filesystem::path> folders_;  // outermost first
};

// Checks (and creates, if missing) the folder of `socket_path`; the error names the folder,
// its owner or mode, and what to do. `what` names the socket in messages ("control socket").
// Folders it creates are added to `created`.
Status check_socket_folder(const std::string& socket_path, const std::string& what, CreatedFolders& created);

// A listening Unix socket at `path` with `mode`, created without a window in which it has
// another mode; the descriptor, or -1 with *status set.
int bind_unix_socket(const std::string& path, mode_t mode, int backlog, bool nonblocking, Status* status);

}  // namespace gradsync
