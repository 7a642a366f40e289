#include "shared/shm_segment.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>
#include <random>

namespace gradsync {

namespace bip = boost::interprocess;

struct ShmSegment::Impl {
  std::string name;
  bip::mapped_region region;
  bool owns_name = false;

  ~Impl() {
    if (owns_name) bip::shared_memory_object::remove(name.c_str());
  }
};

ShmSegment::ShmSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmSegment::ShmSegment(ShmSegment&&) noexcept = default;
ShmSegment& ShmSegment::operator=(ShmSegment&&) noexcept = default;
ShmSegment::~ShmSegment() = default;

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  if (!valid_name(name)) throw Error(Status::invalid_argument("invalid shared-memory name '" + name + "'"));
  if (bytes == 0) throw Error(Status::invalid_argument("shared-memory segment '" + name + "' must not be empty"));
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  try {
    bip::permissions owner_only(0600);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, owner_only);
    impl->owns_name = true;
    shm.truncate(static_cast<bip::offset_t>(bytes));
    impl->region = bip::mapped_region(shm, bip::read_write, 0, bytes);
    // `shm` (the descriptor) closes here; the mapping keeps the memory alive.
  } catch (const bip::interprocess_exception& e) {
    throw Error(Status::resource_exhausted("cannot create shared-memory segment '" + name + "' of " +
                                           std::to_string(bytes) + " bytes: " + e.what()));
  }
  return ShmSegment(std::move(impl));
}

ShmSegment ShmSegment::open(const std::string& name, const OpenOptions& options) {
  if (!valid_name(name)) {
    // The name comes from a client: echo only a bounded prefix of it.
    const std::string shown = name.size() > 64 ? name.substr(0, 64) + "..." : name;
    throw Error(Status::invalid_argument("invalid shared-memory name '" + shown + "' (" + std::to_string(name.size()) +
                                         " bytes)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    struct stat st {};
    if (::fstat(shm.get_mapping_handle().handle, &st) != 0) {
      throw Error(Status::internal("fstat of shared-memory segment '" + name + "' failed: " + std::strerror(errno)));
    }
    if (options.check_owner && st.st_uid != options.owner_uid) {
      throw Error(Status::permission_denied("shared-memory segment '" + name + "' is owned by uid " +
                                            std::to_string(st.st_uid) + ", not by the client's uid " +
                                            std::to_string(options.owner_uid)));
    }
    if (options.check_owner && (st.st_mode & 077) != 0) {
      throw Error(Status::permission_denied("shared-memory segment '" + name +
                                            "' is accessible to other users; it must be mode 0600"));
    }
    if (options.expected_bytes != 0 && static_cast<size_t>(st.st_size) != options.expected_bytes) {
      throw Error(Status::invalid_argument("shared-memory segment '" + name + "' has " + std::to_string(st.st_size) +
                                           " bytes, but " + std::to_string(options.expected_bytes) +
                                           " were announced"));
    }
    if (st.st_size == 0) throw Error(Status::invalid_argument("shared-memory segment '" + name + "' is empty"));
    impl->region = bip::mapped_region(shm, bip::read_write, 0, static_cast<size_t>(st.st_size));
  } catch (const bip::interprocess_exception& e) {
    throw Error(Status::invalid_argument("cannot open shared-memory segment '" + name + "': " + e.what()));
  }
  return ShmSegment(std::move(impl));
}

std::string ShmSegment::unique_name(const std::string& tag) {
  // The counter makes names unique within the process; the random part makes them hard to
  // guess for other processes of the same user before the name is removed.
  static std::atomic<uint64_t> counter{0};  // process-wide uniqueness is the point; no other state
  std::random_device device;
  char random[17];
  std::snprintf(random, sizeof(random), "%08x%08x", device(), device());
  return "gradsync-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
         random;
}

bool ShmSegment::valid_name(const std::string& name) {
  constexpr std::string_view kPrefix = "gradsync-";
  if (name.size() <= kPrefix.size() || name.size() > 200 || name.compare(0, kPrefix.size(), kPrefix) != 0) {
    return false;
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) return false;
  }
  return true;
}

void ShmSegment::unlink() {
  if (impl_ && impl_->owns_name) {
    bip::shared_memory_object::remove(impl_->name.c_str());
    impl_->owns_name = false;
  }
}

void ShmSegment::remove_name(const std::string& name) { bip::shared_memory_object::remove(name.c_str()); }

std::byte* ShmSegment::data() const { return static_cast<std::byte*>(impl_->region.get_address()); }
size_t ShmSegment::size() const { return impl_->region.get_size(); }
const std::string& ShmSegment::name() const { return impl_->name; }

}  // namespace gradsync
