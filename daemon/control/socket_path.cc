#include "daemon/control/socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <vector>

namespace gradsync {
namespace {

std::string octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

}  // namespace

namespace {

constexpr int kMaxLinkHops = 40;  // as the kernel's own limit (ELOOP)

// Walks from `start`, a path without symlinks, up to the root, refusing a folder that is not
// root's or ours, or that others can write (`start` itself: at all; above it: unless sticky,
// like /tmp). A symlink found here appeared after the path was resolved: refused.
Status check_chain(const std::filesystem::path& start, bool start_is_direct, const std::string& socket_path,
                   const std::string& what) {
  const uid_t self = ::geteuid();
  bool direct = start_is_direct;
  for (auto p = start;; p = p.parent_path()) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      return Status::invalid_argument(what + ": cannot examine folder " + p.string() + ": " + std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) {
      return Status::permission_denied(what + " " + socket_path + ": " + p.string() +
                                       " became a symlink while it was checked");
    }
    if (!S_ISDIR(st.st_mode)) return Status::invalid_argument(what + ": " + p.string() + " is not a folder");
    if (st.st_uid != 0 && st.st_uid != self) {
      return Status::permission_denied(what + " " + socket_path + ": folder " + p.string() + " belongs to uid " +
                                       std::to_string(st.st_uid) + ", not to root or gradsyncd's user (uid " +
                                       std::to_string(self) + "), who could replace the socket; use a folder " +
                                       "gradsyncd owns, such as /run/gradsync");
    }
    const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    const bool sticky = (st.st_mode & S_ISVTX) != 0;
    if (others_write && (direct || !sticky)) {
      return Status::permission_denied(what + " " + socket_path + ": folder " + p.string() + " (mode " +
                                       octal(st.st_mode) + ") can be written by other users, who could squat " +
                                       "or replace the socket; use a folder only gradsyncd's user can write, " +
                                       "such as /run/gradsync");
    }
    direct = false;
    if (p == p.root_path() || p.parent_path() == p) break;
  }
  return Status();
}

// Resolves the absolute `path` one component at a time, as the kernel does, into a path
// without symlinks (*real; a missing tail is kept as written). Every symlink on the way, also
// one a link leads to, must be root's or ours and lie in a folder that passes check_chain:
// else whoever owns it, or can replace it, could point the socket's folder elsewhere.
Status resolve_links(const std::filesystem::path& path, const std::string& socket_path, const std::string& what,
                     std::filesystem::path* real) {
  const uid_t self = ::geteuid();
  const std::filesystem::path written = path.relative_path();
  std::deque<std::filesystem::path> pending(written.begin(), written.end());
  std::filesystem::path current = path.root_path();
  int hops = 0;
  while (!pending.empty()) {
    const std::filesystem::path part = pending.front();
    pending.pop_front();
    if (part.empty() || part == ".") continue;
    if (part == "..") {  // `current` holds no link, so its parent is what ".." names
      current = current.parent_path();
      continue;
    }
    const std::filesystem::path next = current / part;
    struct stat st {};
    if (::lstat(next.c_str(), &st) != 0) {
      // Missing from here on: it is created (check_socket_folder), not resolved.
      for (current = next; !pending.empty(); pending.pop_front()) current /= pending.front();
      break;
    }
    if (!S_ISLNK(st.st_mode)) {
      current = next;
      continue;
    }
    if (st.st_uid != 0 && st.st_uid != self) {
      return Status::permission_denied(what + " " + socket_path + ": " + next.string() + " is a symlink of uid " +
                                       std::to_string(st.st_uid) + ", who could point it elsewhere; use a " +
                                       "folder gradsyncd owns, such as /run/gradsync");
    }
    if (Status s = check_chain(current, false, socket_path, what); !s.ok()) return s;
    if (++hops > kMaxLinkHops) {
      return Status::invalid_argument(what + " " + socket_path + ": more than " + std::to_string(kMaxLinkHops) +
                                      " symlinks on the way");
    }
    std::error_code error;
    const std::filesystem::path target = std::filesystem::read_symlink(next, error);
    if (error) return Status::invalid_argument(what + ": cannot read symlink " + next.string() + ": " + error.message());
    const std::filesystem::path relative = target.relative_path();
    pending.insert(pending.begin(), relative.begin(), relative.end());
    if (target.is_absolute()) current = target.root_path();
  }
  *real = current;
  return Status();
}

}  // namespace

Status check_socket_folder(const std::string& socket_path, const std::string& what, CreatedFolders& created) {
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(socket_path, error);
  if (error) return Status::invalid_argument(what + " " + socket_path + ": " + error.message());
  for (const auto& part : absolute) {
    if (part == "..") {
      return Status::invalid_argument(what + " " + socket_path +
                                      ": a path with '..' in it is refused; give the folder's own path");
    }
  }
  std::filesystem::path folder;
  if (Status s = resolve_links(absolute.parent_path(), socket_path, what, &folder); !s.ok()) return s;
  std::vector<std::filesystem::path> missing;
  for (auto p = folder; !p.empty() && !std::filesystem::exists(p, error); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.root_path()) break;
  }
  // Nothing is made under a folder that is not safe: another user could swap what was made.
  if (!missing.empty()) {
    if (Status s = check_chain(missing.back().parent_path(), false, socket_path, what); !s.ok()) return s;
  }
  // Create what is missing, each folder 0755 and ours. One that appears meanwhile is not
  // followed into: only a folder (checked below) may take the place of one that was missing.
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0755) != 0) {
      const int failure = errno;
      struct stat st {};
      if (failure == EEXIST && ::lstat(it->c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      return Status::invalid_argument(what + ": cannot create folder " + it->string() + ": " +
                                      (failure == EEXIST ? std::string("something else appeared there")
                                                         : std::string(std::strerror(failure))));
    }
    created.add(*it);
    // 0755 whatever the umask (the unit's is 0077): other users' trainers must reach the socket.
    ::chmod(it->c_str(), 0755);
  }
  return check_chain(folder, true, socket_path, what);
}

int bind_unix_socket(const std::string& path, mode_t mode, int backlog, bool nonblocking, Status* status) {
  sockaddr_un address{};
  if (path.empty() || path.size() >= sizeof address.sun_path) {
    *status = Status::invalid_argument("socket path '" + path + "' is empty or too long");
    return -1;
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) {
    *status = Status::internal(path + ": socket: " + std::strerror(errno));
    return -1;
  }
  // The file bind() creates takes the socket's own mode (less the umask): set it first.
  const auto failed = [&](const char* call) {
    *status = Status::internal(path + ": " + call + ": " + std::strerror(errno));
    ::close(fd);
    return -1;
  };
  if (::fchmod(fd, mode) != 0) return failed("fchmod");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return failed("bind");
  // The umask may have taken bits the mode wants (others' access for --allow-uid). The folder
  // is gradsyncd's alone (check_socket_folder), so the name still is this socket.
  if (::chmod(path.c_str(), mode) != 0 || ::listen(fd, backlog) != 0) {
    const int saved = errno;
    ::unlink(path.c_str());
    errno = saved;
    return failed("listen");
  }
  return fd;
}

}  // namespace gradsync
