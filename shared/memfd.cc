#include "shared/memfd.h"

#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace gradsync {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string file_type(mode_t mode) {
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

std::string seal_names(unsigned seals) {
  std::string names;
  auto add = [&](unsigned bit, const char* name) {
    if (seals & bit) names += (names.empty() ? "" : " | ") + std::string(name);
  };
  add(F_SEAL_SHRINK, "F_SEAL_SHRINK");
  add(F_SEAL_GROW, "F_SEAL_GROW");
  add(F_SEAL_SEAL, "F_SEAL_SEAL");
  add(F_SEAL_WRITE, "F_SEAL_WRITE");
  add(F_SEAL_FUTURE_WRITE, "F_SEAL_FUTURE_WRITE");
  return names;
}

}  // namespace

Mapping::Mapping(Mapping&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (address_) ::munmap(address_, size_);
    address_ = std::exchange(other.address_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (address_) ::munmap(address_, size_);
}

MappedMemfd MappedMemfd::create(const std::string& tag, size_t bytes) {
  if (bytes == 0) throw Error(Status::invalid_argument("memory '" + tag + "' must not be empty"));
  const std::string name = "gradsync-" + tag;
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw Error(Status::resource_exhausted("memfd_create(" + name + ") failed: " + errno_text()));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    throw Error(Status::resource_exhausted("cannot size memory '" + name + "' to " + std::to_string(bytes) +
                                           " bytes: " + errno_text()));
  }
  Mapping mapping;
  throw_if_error(map_fd(fd.get(), bytes, Access::kReadWrite, name, &mapping));
  return MappedMemfd(std::move(fd), std::move(mapping));
}

void MappedMemfd::seal(unsigned seals) {
  if (::fcntl(fd_.get(), F_ADD_SEALS, seals) != 0) {
    throw Error(Status::internal("cannot add seals " + seal_names(seals) + ": " + errno_text()));
  }
}

Status check_memfd(int fd, unsigned required_seals, size_t expected_bytes, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::invalid_argument(what + ": fstat failed: " + errno_text());
  if (!S_ISREG(st.st_mode)) return Status::invalid_argument(what + " is " + file_type(st.st_mode) + ", not a memfd");
  // A memfd is the one kind of file whose /proc link reads "/memfd:<name> (deleted)"; a tmpfs or
  // disk file would let its owner truncate it through its path.
  char link[256] = {};
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t length = ::readlink(proc.c_str(), link, sizeof(link) - 1);
  const std::string target(link, length > 0 ? static_cast<size_t>(length) : 0);
  if (target.rfind("/memfd:", 0) != 0) {
    return Status::invalid_argument(what + " is a file (" + target.substr(0, 80) + "), not a memfd");
  }
  // Only shmem's: a hugetlbfs memfd (MFD_HUGETLB) can have a page punched out under its seals
  // (FALLOC_FL_PUNCH_HOLE changes no size), and when no free huge page is left to fault back in,
  // the reader dies of SIGBUS. A punched shmem page reads back as zeros.
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return Status::invalid_argument(what + ": fstatfs failed: " + errno_text());
  if (fs.f_type != TMPFS_MAGIC) {
    return Status::invalid_argument(what + " is a memfd of " +
                                    (fs.f_type == HUGETLBFS_MAGIC ? std::string("huge pages (MFD_HUGETLB)")
                                                                  : "file system type " + std::to_string(fs.f_type)) +
                                    "; only ordinary memfds are taken (a huge page punched out of one would "
                                    "kill its reader)");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return Status::invalid_argument(what + ": cannot read its seals: " + errno_text());
  const unsigned missing = required_seals & ~static_cast<unsigned>(seals);
  if (missing != 0) {
    return Status::invalid_argument(what + " is a memfd without the seals " + seal_names(missing) +
                                    "; seal it with F_ADD_SEALS (" + seal_names(required_seals) +
                                    ") before passing it");
  }
  if (st.st_size == 0) return Status::invalid_argument(what + " is empty");
  if (expected_bytes != 0 && static_cast<size_t>(st.st_size) != expected_bytes) {
    return Status::invalid_argument(what + " has " + std::to_string(st.st_size) + " bytes, but " +
                                    std::to_string(expected_bytes) + " were announced");
  }
  return Status::ok_status();
}

Status map_fd(int fd, size_t bytes, Access access, const std::string& what, Mapping* out) {
  const int protection = access == Access::kReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;
  void* address = ::mmap(nullptr, bytes, protection, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    return Status::invalid_argument("cannot map " + what + " (" + std::to_string(bytes) + " bytes" +
                                    (access == Access::kReadWrite ? ", read-write" : ", read-only") +
                                    "): " + errno_text());
  }
  *out = Mapping(address, bytes);
  return Status::ok_status();
}

}  // namespace gradsync
