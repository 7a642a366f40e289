// A named POSIX shared-memory segment mapped into this process (Boost.Interprocess underneath).
// RAII: the mapping lives exactly as long as the object; the name is removed by its creator,
// either explicitly as soon as the peer has mapped it, or at destruction.
//
// Names are created owner-only (mode 0600), so other users can never read gradient memory.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <string>

#include "shared/status.h"

namespace gradsync {

class ShmSegment {
 public:
  ShmSegment(ShmSegment&&) noexcept;
  ShmSegment& operator=(ShmSegment&&) noexcept;
  ~ShmSegment();

  // Creates `name` (failing if it exists), sizes it to `bytes`, zero-filled, and maps it.
  // This object owns the name and removes it at destruction unless unlink() ran first.
  static ShmSegment create(const std::string& name, size_t bytes);

  // Maps an existing segment read-write. Fails with kInvalidArgument when it does not exist,
  // when its size is not `expected_bytes`, or (when check_owner) when it is not owned by
  // `owner_uid` or is readable by anyone but its owner. Does not own the name.
  struct OpenOptions {
    size_t expected_bytes = 0;
    bool check_owner = false;
    uid_t owner_uid = 0;
  };
  static ShmSegment open(const std::string& name, const OpenOptions& options);

  // A fresh name unique to this process: "gradsync-<tag>-<pid>-<counter>-<random>".
  static std::string unique_name(const std::string& tag);

  // True when `name` is one this library could have made: gradsync-[A-Za-z0-9-]+, at most 200
  // characters. The daemon refuses anything else, so a client cannot make it open arbitrary
  // objects.
  static bool valid_name(const std::string& name);

  // Removes the name now; the mapping stays valid. Idempotent.
  void unlink();

  // Removes a name this process did not create (the daemon, once it mapped a client's segment).
  static void remove_name(const std::string& name);

  std::byte* data() const;
  size_t size() const;
  const std::string& name() const;

 private:
  struct Impl;
  explicit ShmSegment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync
