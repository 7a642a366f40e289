// Anonymous shared memory passed between processes as a file descriptor: a memfd, mapped with
// MAP_SHARED. No name exists anywhere (nothing in /dev/shm), so the only way into the memory is
// a descriptor that its creator chose to hand over, over the control socket (SCM_RIGHTS).
//
// Seals are what make sharing with an untrusted process safe:
//   kSizeSeals (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): nobody can change the size any more,
//     so a mapping can never lose its pages under the other side (the SIGBUS of a truncated
//     named segment) and nobody can add or remove seals later.
//   F_SEAL_FUTURE_WRITE, added after the creator mapped it writable: the creator's mapping stays
//     writable, every later writable mapping, write() or reopened descriptor is refused, so the
//     receiver can only read (the daemon's completion rings).
#pragma once

#include <fcntl.h>

#include <cstddef>
#include <string>

#include "shared/status.h"
#include "shared/unique_fd.h"

namespace gradsync {

inline constexpr unsigned kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// A mapping of `size` bytes; unmapped at destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* address, size_t size) : address_(address), size_(size) {}
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  std::byte* data() const { return static_cast<std::byte*>(address_); }
  size_t size() const { return size_; }

 private:
  void* address_ = nullptr;
  size_t size_ = 0;
};

enum class Access { kReadOnly, kReadWrite };

// A memfd with its mapping. The descriptor may be handed over (release_fd) or closed once the
// peer has it: the mapping alone keeps the memory alive.
class MappedMemfd {
 public:
  MappedMemfd() = default;
  MappedMemfd(MappedMemfd&&) noexcept = default;
  MappedMemfd& operator=(MappedMemfd&&) noexcept = default;

  // A fresh zero-filled memfd named "gradsync-<tag>" (the name shows only in /proc/PID/maps),
  // sized, mapped read-write, sealable. Throws Error (kResourceExhausted) when the kernel
  // refuses.
  static MappedMemfd create(const std::string& tag, size_t bytes);

  // Adds seals; throws Error when the kernel refuses.
  void seal(unsigned seals);

  std::byte* data() const { return mapping_.data(); }
  size_t size() const { return mapping_.size(); }
  const UniqueFd& fd() const { return fd_; }
  UniqueFd release_fd() { return std::move(fd_); }
  Mapping release_mapping() { return std::move(mapping_); }

 private:
  MappedMemfd(UniqueFd fd, Mapping mapping) : fd_(std::move(fd)), mapping_(std::move(mapping)) {}
  UniqueFd fd_;
  Mapping mapping_;
};

// Checks that `fd` is a memfd carrying at least `required_seals`, of exactly `expected_bytes`
// when that is non-zero; the error names what is wrong ("is a pipe, not a memfd", "lacks
// F_SEAL_SHRINK", "has 4096 bytes, not 8192"). `what` names the descriptor in errors.
Status check_memfd(int fd, unsigned required_seals, size_t expected_bytes, const std::string& what);

// Maps the whole of a descriptor checked with check_memfd (MAP_SHARED).
Status map_fd(int fd, size_t bytes, Access access, const std::string& what, Mapping* out);

}  // namespace gradsync
