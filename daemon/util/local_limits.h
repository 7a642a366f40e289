// What one local user, client or job may hold in the daemon (issue 10, item 3). Every limit is a
// gradsyncd setting; hitting one refuses the request that would pass it, with an error that
// names the limit and the setting, and nothing else changes: the daemon and every other job
// carry on.
//
// The defaults serve a real 8-GPU node with room to spare (8 trainers per job, a handful of
// jobs, a few tensor sets of up to a million tensors each) while keeping one user from
// exhausting what every user shares: descriptors, mappings (vm.max_map_count, 65530 by
// default), threads and memory.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "shared/status.h"
#include "shared/mutex.h"

namespace gradsync {

struct LocalLimits {
  uint32_t connections_per_user = 64;             // --max-connections-per-user
  uint32_t jobs_per_user = 16;                    // --max-jobs-per-user
  uint32_t jobs = 64;                             // --max-jobs (each job has a worker thread)
  uint32_t pending_registrations_per_user = 256;  // --max-pending-registrations-per-user
  uint32_t segments_per_client = 4096;            // --max-segments-per-client
  uint32_t segments_per_user = 16384;             // --max-segments-per-user (a mapping each)
  uint64_t tensors_per_client = 1u << 20;         // --max-tensors-per-client
  uint32_t local_world_size = 256;                // --max-local-world-size (at most 1024)
  // Segments of all users together: half of vm.max_map_count, read at start (not a flag), so
  // that the daemon's own mappings (rings, stacks, large blocks) always have room.
  uint32_t segments_total = 32765;
  // Bytes: what one user's segments map into the daemon's address space, plus its
  // registrations being checked (kBytesPerPendingTensor each tensor), against one budget; all
  // users' together against another; and one segment's size. 0 = derived from the machine's
  // physical memory at start (resolve_byte_limits): a segment and a user at most the physical
  // memory, all users twice that, at most 64 TiB (half of x86-64's 128 TiB of user address
  // space). An empty sealed memfd costs no memory but its whole size in address space.
  uint64_t segment_bytes = 0;   // --max-segment-bytes
  uint64_t bytes_per_user = 0;  // --max-bytes-per-user
  uint64_t bytes_total = 0;     // --max-bytes
  bool operator==(const LocalLimits&) const = default;
};

// What a registration waiting to be checked and for its barrier costs the daemon per tensor:
// its decoded request and tables (about 58 MB for a million tensors, measured by the review).
inline constexpr uint64_t kBytesPerPendingTensor = 64;
// What a registered set's mask holds in the daemon per kept index (its copy of the indices and
// the kept runs made from them), charged to the user's budget for as long as the set lives.
inline constexpr uint64_t kBytesPerMaskIndex = 32;

// Fills the byte limits left at 0 from `physical` bytes of memory (sysconf at start).
void resolve_byte_limits(uint64_t physical, LocalLimits* limits);

// Renders a byte count for messages: "1.5 GiB (1610612736 bytes)".
std::string describe_bytes(uint64_t bytes);



// The per-user counts, shared by every session (thread-safe: a ticket may be released on any
// thread, e.g. with a registration callback the worker drops).
class UserCounts : public std::enable_shared_from_this<UserCounts> {
 public:
  enum class What { kConnections, kPendingRegistrations, kSegments, kJobs, kBytes };

  explicit UserCounts(LocalLimits limits) : limits_(limits) {}
  const LocalLimits& limits() const { return limits_; }

  // Holds `n` of `what` for one user until destroyed.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { release(); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    void release();

   private:
    friend class UserCounts;
    std::shared_ptr<UserCounts> counts_;
    What what_ = What::kConnections;
    uid_t uid_ = 0;
    uint64_t n_ = 0;
  };

  // The daemon-wide counts' key (no user has this uid).
  static constexpr uid_t kEveryone = static_cast<uid_t>(-1);

  // Takes `n` of `what` for `uid`, or says which limit that would pass (resource_exhausted,
  // naming the setting). Segments, jobs and bytes count against a daemon-wide limit too
  // (segments_total, --max-jobs, --max-bytes); `ticket` then holds both.
  Status take(What what, uid_t uid, uint64_t n, Ticket* ticket);

  // How many `uid` holds now.
  uint64_t held(What what, uid_t uid) const;

 private:
  void give_back(What what, uid_t uid, uint64_t n);
  Status take_locked(What what, uid_t uid, uint64_t n) GS_REQUIRES(mutex_);

  const LocalLimits limits_;
  mutable Mutex mutex_;
  std::map<std::pair<What, uid_t>, uint64_t> held_ GS_GUARDED_BY(mutex_);  // no zero entries
};

// "limit reached: <what> (gradsyncd --<setting> <value>)", resource_exhausted.
Status limit_reached(const std::string& what, const char* setting, uint64_t value);

}  // namespace gradsync
