#include "daemon/util/local_limits.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace gradsync {

Status limit_reached(const std::string& what, const char* setting, uint64_t value) {
  return Status::resource_exhausted("limit reached: " + what + " (gradsyncd --" + setting + " " +
                                    std::to_string(value) + "; ask the operator to raise it)");
}

void resolve_byte_limits(uint64_t physical, LocalLimits* limits) {
  constexpr uint64_t kAddressSpaceShare = uint64_t{64} << 40;  // 64 TiB
  physical = std::max<uint64_t>(physical, uint64_t{1} << 30);
  if (limits->segment_bytes == 0) limits->segment_bytes = std::min(physical, kAddressSpaceShare);
  if (limits->bytes_per_user == 0) limits->bytes_per_user = std::min(physical, kAddressSpaceShare);
  if (limits->bytes_total == 0) limits->bytes_total = std::min(2 * physical, kAddressSpaceShare);
}

std::string describe_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " bytes";
  char text[64];
  std::snprintf(text, sizeof text, "%.1f %s (%llu bytes)", value, kUnits[unit], static_cast<unsigned long long>(bytes));
  return text;
}

UserCounts::Ticket& UserCounts::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    release();
    counts_ = std::move(other.counts_);
    what_ = other.what_;
    uid_ = other.uid_;
    n_ = other.n_;
    other.n_ = 0;
  }
  return *this;
}

void UserCounts::Ticket::release() {
  if (counts_ && n_ > 0) counts_->give_back(what_, uid_, n_);
  counts_.reset();
  n_ = 0;
}

Status UserCounts::take_locked(What what, uid_t uid, uint64_t n) {
  uint64_t limit = 0;
  const char* setting = "";
  std::string noun;
  const bool everyone = uid == kEveryone;
  switch (what) {
    case What::kConnections:
      limit = limits_.connections_per_user, setting = "max-connections-per-user", noun = "connections";
      break;
    case What::kPendingRegistrations:
      limit = limits_.pending_registrations_per_user, setting = "max-pending-registrations-per-user";
      noun = "tensor-set registrations waiting for their barrier";
      break;
    case What::kSegments:
      limit = everyone ? limits_.segments_total : limits_.segments_per_user;
      setting = "max-segments-per-user", noun = "memory segments";
      break;
    case What::kJobs:
      limit = everyone ? limits_.jobs : limits_.jobs_per_user;
      setting = everyone ? "max-jobs" : "max-jobs-per-user";
      noun = "jobs (running, failed with members still connected, or being retired)";
      break;
    case What::kBytes:
      limit = everyone ? limits_.bytes_total : limits_.bytes_per_user;
      setting = everyone ? "max-bytes" : "max-bytes-per-user";
      break;
  }
  uint64_t& held = held_[{what, uid}];
  if (held <= limit && n <= limit - held) {  // (never held + n: a limit near 2^64 would wrap)
    held += n;
    return Status();
  }
  const uint64_t now = held;
  if (held == 0) held_.erase({what, uid});
  if (what == What::kBytes) {
    const std::string asked = "; this request needs " + describe_bytes(n);
    if (everyone) {
      return limit_reached("the daemon's segments and registrations of all users already take " + describe_bytes(now) +
                               " of at most " + describe_bytes(limit) + asked,
                           setting, limit);
    }
    return limit_reached("uid " + std::to_string(uid) + "'s segments and registrations already take " +
                             describe_bytes(now) + " of at most " + describe_bytes(limit) + " per user" + asked,
                         setting, limit);
  }
  if (everyone && what == What::kSegments) {
    return Status::resource_exhausted("limit reached: this daemon already holds " + std::to_string(now) +
                                      " memory segments of all users, at most " + std::to_string(limit) +
                                      " (half of vm.max_map_count; raise that sysctl and restart gradsyncd)");
  }
  if (everyone) {
    return limit_reached("this daemon already has " + std::to_string(now) + " " + noun + ", at most " +
                             std::to_string(limit),
                         setting, limit);
  }
  return limit_reached("uid " + std::to_string(uid) + " already holds " + std::to_string(now) + " " + noun +
                           " in this daemon, at most " + std::to_string(limit) + " per user",
                       setting, limit);
}

Status UserCounts::take(What what, uid_t uid, uint64_t n, Ticket* ticket) {
  ticket->release();  // outside the lock: it may be one of ours
  MutexLock lock(mutex_);
  if (Status s = take_locked(what, uid, n); !s.ok()) return s;
  const bool shared = what == What::kSegments || what == What::kJobs || what == What::kBytes;
  if (shared) {
    if (Status s = take_locked(what, kEveryone, n); !s.ok()) {
      uint64_t& held = held_[{what, uid}];
      held -= n;
      if (held == 0) held_.erase({what, uid});
      return s;
    }
  }
  ticket->counts_ = shared_from_this();
  ticket->what_ = what;
  ticket->uid_ = uid;
  ticket->n_ = n;
  return Status();
}

uint64_t UserCounts::held(What what, uid_t uid) const {
  MutexLock lock(mutex_);
  auto it = held_.find({what, uid});
  return it == held_.end() ? 0 : it->second;
}

void UserCounts::give_back(What what, uid_t uid, uint64_t n) {
  MutexLock lock(mutex_);
  const auto put_back = [&](uid_t who) GS_REQUIRES(mutex_) {
    auto it = held_.find({what, who});
    if (it == held_.end()) return;
    it->second -= std::min(it->second, n);
    if (it->second == 0) held_.erase(it);
  };
  put_back(uid);
  if (what == What::kSegments || what == What::kJobs || what == What::kBytes) put_back(kEveryone);
}

}  // namespace gradsync
