// Where gradsyncd may put a Unix socket (the control socket, the admin socket) so that no other
// user can squat it or swap it: the socket's folder must belong to gradsyncd's user or root and
// be writable by nobody else, and so must every folder above it, except that a folder above may
// be world-writable with the sticky bit (like /tmp), which keeps others from renaming what is
// not theirs. Symlinks on the way (and those they lead to) must be root's or gradsyncd's, in
// folders that pass the same checks, and the checks apply to the folders they lead to. A folder
// that does not exist is created, owned by gradsyncd, mode 0755, under a folder that passes
// these checks; a path with ".." in it is refused.
//
// The socket itself gets its mode before it has a name: bind_unix_socket() sets the socket's
// mode with fchmod, which Linux gives the file that bind() creates, so the socket is never more
// open than intended, not even for a moment.
#pragma once

#include <sys/types.h>

#include <string>

#include "daemon/control/owned_paths.h"
#include "shared/status.h"

namespace gradsync {

// Checks (and creates, if missing) the folder of `socket_path`; the error names the folder,
// its owner or mode, and what to do. `what` names the socket in messages ("control socket").
// Missing folders are made only under a folder that passes the same checks, and are added to
// `created`.
Status check_socket_folder(const std::string& socket_path, const std::string& what, CreatedFolders& created);

// A listening Unix socket at `path` with `mode`, created without a window in which it has
// another mode; the descriptor, or -1 with *status set.
int bind_unix_socket(const std::string& path, mode_t mode, int backlog, bool nonblocking, Status* status);

}  // namespace gradsync
