#include "daemon/control/local_limits.h"

namespace gradsync {

Status limit_reached(const std::string& what, const char* setting, uint64_t value) {
  return Status::resource_exhausted("limit reached: " + what + " (gradsyncd --" + setting + " " +
                                    std::to_string(value) + "; ask the operator to raise it)");
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
  }
  uint64_t& held = held_[{what, uid}];
  if (held + n <= limit) {
    held += n;
    return Status();
  }
  const uint64_t now = held;
  if (held == 0) held_.erase({what, uid});
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
  std::lock_guard lock(mutex_);
  if (Status s = take_locked(what, uid, n); !s.ok()) return s;
  const bool shared = what == What::kSegments || what == What::kJobs;
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
  std::lock_guard lock(mutex_);
  auto it = held_.find({what, uid});
  return it == held_.end() ? 0 : it->second;
}

void UserCounts::give_back(What what, uid_t uid, uint64_t n) {
  std::lock_guard lock(mutex_);
  const auto put_back = [&](uid_t who) {
    auto it = held_.find({what, who});
    if (it == held_.end()) return;
    it->second -= std::min(it->second, n);
    if (it->second == 0) held_.erase(it);
  };
  put_back(uid);
  if (what == What::kSegments || what == What::kJobs) put_back(kEveryone);
}

}  // namespace gradsync
