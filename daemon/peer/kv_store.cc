#include "daemon/peer/kv_store.h"

#include <malloc.h>

#include <algorithm>
#include <cctype>

namespace gradsync {

KvStore::KvStore(Limits limits) : limits_(limits), expiry_([this] { expire_loop(); }) {}

KvStore::~KvStore() {
  // Stop parking first, so no get slips in between the abort and the end.
  shutdown(Status::aborted("the peer service is shutting down"));
  expiry_.join();
}

size_t KvStore::count_prefix(const std::string& job, const std::string& prefix) {
  MutexLock lock(mutex_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  size_t n = 0;
  for (auto key = it->second.lower_bound(prefix); key != it->second.end() && key->first.rfind(prefix, 0) == 0; ++key) ++n;
  return n;
}

bool KvStore::peek(const std::string& job, const std::string& key, std::string* value) {
  MutexLock lock(mutex_);
  std::vector<std::string> values;
  if (!lookup_locked(job, {key}, &values)) return false;
  *value = std::move(values[0]);
  return true;
}

bool KvStore::lookup_locked(const std::string& job, const std::vector<std::string>& keys,
                            std::vector<std::string>* values) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  // First whether every key is there (no copy: a get that asks for one big value many times
  // and one missing key must cost nothing), then the copy.
  for (const auto& key : keys) {
    if (!it->second.count(key)) return false;
  }
  values->clear();
  for (const auto& key : keys) values->push_back(it->second.at(key));
  return true;
}

void KvStore::forget_waiter_locked(const Waiter& waiter) {
  for (const auto& key : waiter.keys) waiting_key_bytes_ -= key.size();
  auto it = waiters_by_caller_.find(waiter.caller.name);
  if (it != waiters_by_caller_.end() && --it->second == 0) waiters_by_caller_.erase(it);
  auto group = waiters_by_group_.find(waiter.caller.group);
  if (group != waiters_by_group_.end() && --group->second == 0) waiters_by_group_.erase(group);
  auto job = waiters_by_job_.find(waiter.job);
  if (job != waiters_by_job_.end() && --job->second == 0) waiters_by_job_.erase(job);
}

void KvStore::park_locked(Waiter waiter) {
  needs_[{waiter.job, waiter.keys[waiter.needs]}].insert(waiter.id);
  deadlines_.emplace(waiter.deadline, waiter.id);
  const uint64_t id = waiter.id;
  waiters_.emplace(id, std::move(waiter));
}

KvStore::Waiter KvStore::unpark_locked(uint64_t id) {
  auto it = waiters_.find(id);
  Waiter waiter = std::move(it->second);
  waiters_.erase(it);
  auto need = needs_.find({waiter.job, waiter.keys[waiter.needs]});
  if (need != needs_.end()) {
    need->second.erase(id);
    if (need->second.empty()) needs_.erase(need);
  }
  for (auto d = deadlines_.lower_bound(waiter.deadline); d != deadlines_.end() && d->first == waiter.deadline; ++d) {
    if (d->second == id) {
      deadlines_.erase(d);
      break;
    }
  }
  forget_waiter_locked(waiter);
  return waiter;
}

KvStore::Ready KvStore::wake_locked(const std::string& job, const std::string& key) {
  Ready ready;
  auto need = needs_.find({job, key});
  if (need == needs_.end()) return ready;
  const std::set<uint64_t> ids = std::move(need->second);
  needs_.erase(need);
  const auto& keys_of_job = jobs_.at(job);
  for (uint64_t id : ids) {
    ++examined_;
    Waiter& waiter = waiters_.at(id);
    // The keys before `needs` were there when looked at; one may have been deleted since, so
    // a waiter that reaches its end is checked whole, and starts over if one is gone.
    size_t& at = waiter.needs;
    while (at < waiter.keys.size() && keys_of_job.count(waiter.keys[at])) ++at;
    std::vector<std::string> values;
    if (at == waiter.keys.size() && !lookup_locked(job, waiter.keys, &values)) {
      at = 0;
      while (keys_of_job.count(waiter.keys[at])) ++at;
    }
    if (at < waiter.keys.size()) {
      needs_[{job, waiter.keys[at]}].insert(id);  // parked under its next missing key
      continue;
    }
    waiter.needs = 0;  // (unpark_locked looks for it under keys[needs], which is set now: no entry)
    Waiter done = unpark_locked(id);
    ready.emplace_back(std::move(done.done), std::move(values));
  }
  return ready;
}

void KvStore::trim_locked(size_t freed) {
  // glibc keeps freed heap for reuse; a flood's worth is handed back so that the daemon's
  // memory returns to where it was.
  if (freed >= (1u << 20)) ::malloc_trim(0);
}

Status KvStore::check_names(const std::string& job, const std::string& key) const {
  if (job.size() > limits_.max_name_bytes || key.size() > limits_.max_name_bytes) {
    return Status::invalid_argument("job ids and keys are limited to " + std::to_string(limits_.max_name_bytes) +
                                    " bytes");
  }
  return Status();
}

// The slot for job/key, created if needed within the limits on jobs, keys and bytes; the
// accounting already counts `bytes` as its new value.
void KvStore::count_locked(const StoreMember& member, size_t bytes, int sign) {
  if (member.empty()) return;
  for (auto* uses : {&members_, &groups_}) {
    const std::string& id = uses == &members_ ? member.name : member.group;
    MemberUse& use = (*uses)[id];
    if (sign > 0) {
      use.bytes += bytes;
      ++use.keys;
    } else {
      use.bytes -= bytes;
      if (--use.keys == 0) uses->erase(id);
    }
  }
}

Status KvStore::check_room(const StoreMember& member, size_t bytes, size_t keys) {
  if (member.empty() || keys == 0) return Status();
  MutexLock lock(mutex_);
  if (Status room = room_locked({}, member, 0, bytes + keys * kEntryOverhead, true); !room.ok()) return room;
  for (const bool by_name : {true, false}) {
    const auto& uses = by_name ? members_ : groups_;
    const std::string& id = by_name ? member.name : member.group;
    auto it = uses.find(id);
    const size_t held = it == uses.end() ? 0 : it->second.keys;
    const size_t max = by_name ? limits_.max_member_keys : limits_.max_group_keys;
    if (held + keys > max) {
      const std::string what = by_name ? "member" : "member group";
      return Status::resource_exhausted(what + " " + id + " has set " + std::to_string(held) +
                                        " keys in the peer store, too near its limit per " + what + " (" +
                                        std::to_string(max) + ") for a call that sets " + std::to_string(keys));
    }
  }
  return Status();
}

bool KvStore::erase(const std::string& job, const std::string& key) {
  MutexLock lock(mutex_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  auto k = it->second.find(key);
  if (k == it->second.end()) return false;
  const size_t bytes = k->first.size() + k->second.size() + kEntryOverhead;
  release_key_locked(job, key, bytes);
  it->second.erase(k);
  job_bytes_[job] -= bytes;
  total_bytes_ -= bytes;
  if (it->second.empty()) erase_job_locked(job);
  return true;
}

bool KvStore::charge_locked(const StoreMember& from, const StoreMember& to, size_t old_bytes, size_t new_bytes,
                            bool is_new, Status* why) {
  if (Status room = room_locked(from, to, old_bytes, new_bytes, is_new); !room.ok()) {
    *why = room;
    return false;
  }
  if (!is_new) count_locked(from, old_bytes, -1);
  count_locked(to, new_bytes, +1);
  return true;
}

Status KvStore::room_locked(const StoreMember& from, const StoreMember& to, size_t old_bytes, size_t new_bytes,
                            bool is_new) const {
  if (!to.empty()) {
    // What `to` is charged for this key already: its old size, if it owns it.
    const bool same_name = !from.empty() && from.name == to.name, same_group = !from.empty() && from.group == to.group;
    struct Bound {
      const std::map<std::string, MemberUse>& uses;
      const std::string& id;
      bool keeps;
      size_t max_bytes, max_keys;
      const char* what;
    };
    for (const Bound& b : {Bound{members_, to.name, same_name, limits_.max_member_bytes, limits_.max_member_keys,
                                 "member"},
                           Bound{groups_, to.group, same_group, limits_.max_group_bytes, limits_.max_group_keys,
                                 "member group"}}) {
      auto it = b.uses.find(b.id);
      const MemberUse use = it == b.uses.end() ? MemberUse{} : it->second;
      if (use.bytes - (b.keeps ? old_bytes : 0) + new_bytes > b.max_bytes) {
        return Status::resource_exhausted(std::string(b.what) + " " + b.id + " would hold more than " +
                                          std::to_string(b.max_bytes) + " bytes in the peer store, its limit per " +
                                          b.what);
      }
      if ((is_new || !b.keeps) && use.keys >= b.max_keys) {
        return Status::resource_exhausted(std::string(b.what) + " " + b.id + " has set " + std::to_string(use.keys) +
                                          " keys in the peer store, its limit per " + b.what);
      }
    }
  }
  return Status();
}

void KvStore::release_key_locked(const std::string& job, const std::string& key, size_t bytes) {
  auto owner = owners_.find({job, key});
  if (owner == owners_.end()) return;
  count_locked(owner->second, bytes, -1);
  owners_.erase(owner);
}

Status KvStore::slot_locked(const std::string& job, const std::string& key, size_t bytes, const StoreMember& member,
                            std::string** slot) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    if (jobs_.size() >= limits_.max_jobs) {
      return Status::resource_exhausted("the peer store holds " + std::to_string(jobs_.size()) + " jobs, its limit");
    }
  }
  const size_t keys_now = it == jobs_.end() ? 0 : it->second.size();
  const bool is_new = it == jobs_.end() || !it->second.count(key);
  if (keys_now >= limits_.max_keys_per_job && is_new) {
    return Status::resource_exhausted("job " + job + " has " + std::to_string(keys_now) + " keys in the peer store, its limit");
  }
  // Each key costs its map node and string headers too, and each job its own: counted, so that
  // a flood of tiny keys is bounded by real memory, not only by its payload.
  const size_t old_bytes = is_new ? 0 : it->second.at(key).size() + key.size() + kEntryOverhead;
  const size_t new_bytes = bytes + key.size() + kEntryOverhead + (it == jobs_.end() ? job.size() + kEntryOverhead : 0);
  const size_t job_now = job_bytes_.count(job) ? job_bytes_.at(job) : 0;
  if (new_bytes > old_bytes) {
    const size_t more = new_bytes - old_bytes;
    if (job_now + more > limits_.max_job_bytes) {
      return Status::resource_exhausted("job " + job + " would hold more than " + std::to_string(limits_.max_job_bytes) +
                                        " bytes in the peer store, its limit per job");
    }
    if (total_bytes_ + more > limits_.max_total_bytes) {
      return Status::resource_exhausted("the peer store would hold more than " + std::to_string(limits_.max_total_bytes) +
                                        " bytes, its limit overall");
    }
  }
  // The key's charge moves to the member that sets it (the job's own cost stays the job's).
  {
    auto owner = owners_.find({job, key});
    const StoreMember from = owner == owners_.end() ? StoreMember() : owner->second;
    const size_t key_old = is_new ? 0 : old_bytes, key_new = bytes + key.size() + kEntryOverhead;
    Status why;
    if (!charge_locked(from, member, key_old, key_new, is_new || from.empty(), &why)) return why;
    if (member.empty()) {
      if (owner != owners_.end()) owners_.erase(owner);
    } else if (owner == owners_.end()) {
      owners_.emplace(JobKey{job, key}, member);
    } else {
      owner->second = member;
    }
  }
  if (it == jobs_.end()) it = jobs_.emplace(job, std::map<std::string, std::string>{}).first;
  touch_locked(job);
  job_bytes_[job] = job_now + new_bytes - old_bytes;
  total_bytes_ = total_bytes_ + new_bytes - old_bytes;
  *slot = &it->second[key];
  return Status();
}

Status KvStore::set(const std::string& job, const std::string& key, std::string value, const StoreMember& member) {
  bool stored = false;
  return put(job, key, std::move(value), /*if_absent=*/false, &stored, member);
}

Status KvStore::set_if_absent(const std::string& job, const std::string& key, std::string value, bool* stored,
                              const StoreMember& member) {
  return put(job, key, std::move(value), /*if_absent=*/true, stored, member);
}

Status KvStore::put(const std::string& job, const std::string& key, std::string value, bool if_absent, bool* stored,
                    const StoreMember& member) {
  *stored = false;
  if (Status status = check_names(job, key); !status.ok()) return status;
  if (value.size() > limits_.max_value_bytes) {
    return Status::resource_exhausted("value of " + std::to_string(value.size()) + " bytes for key '" + key +
                                      "' exceeds the " + std::to_string(limits_.max_value_bytes) + "-byte limit");
  }
  Ready ready;
  {
    // The absence is checked and the value stored under one lock: the first writer wins.
    MutexLock lock(mutex_);
    if (if_absent) {
      auto it = jobs_.find(job);
      if (it != jobs_.end() && it->second.count(key)) return Status();
    }
    std::string* slot = nullptr;
    if (Status status = slot_locked(job, key, value.size(), member, &slot); !status.ok()) return status;
    *slot = std::move(value);
    *stored = true;
    ready = wake_locked(job, key);
  }
  for (auto& [done, values] : ready) done(Status(), std::move(values));
  return Status();
}

Status KvStore::add(const std::string& job, const std::string& key, int64_t delta, int64_t* result,
                    const StoreMember& member) {
  if (Status status = check_names(job, key); !status.ok()) return status;
  Ready ready;
  {
    MutexLock lock(mutex_);
    // A counter's text is at most 20 bytes: room for that is made up front, and the
    // accounting settles on the text's real size on every way out.
    std::string* found = nullptr;
    if (Status status = slot_locked(job, key, 20, member, &found); !status.ok()) return status;
    std::string& slot = *found;
    const auto settle = [&]() GS_REQUIRES(mutex_) {  // (modular arithmetic: the true totals are never negative)
      job_bytes_[job] = job_bytes_[job] + slot.size() - 20;
      total_bytes_ = total_bytes_ + slot.size() - 20;
      if (!member.empty()) {
        members_[member.name].bytes += slot.size() - 20;
        groups_[member.group].bytes += slot.size() - 20;
      }
    };
    int64_t value = 0;
    if (!slot.empty()) {
      size_t used = 0;
      try {
        value = std::stoll(slot, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != slot.size() || std::isspace(static_cast<unsigned char>(slot[0])) || slot.size() > 20) {
        settle();
        return Status::invalid_argument("key '" + key + "' of job " + job + " does not hold a counter");
      }
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      settle();
      return Status::invalid_argument("adding " + std::to_string(delta) + " to key '" + key + "' overflows");
    }
    slot = std::to_string(value);
    settle();
    *result = value;
    ready = wake_locked(job, key);
  }
  for (auto& [done, values] : ready) done(Status(), std::move(values));
  return Status();
}

void KvStore::erase_job_locked(const std::string& job) {
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    for (const auto& [key, value] : it->second) release_key_locked(job, key, key.size() + value.size() + kEntryOverhead);
  }
  const size_t freed = job_bytes_.count(job) ? job_bytes_.at(job) : 0;
  total_bytes_ -= freed;
  job_bytes_.erase(job);
  touched_.erase(job);
  jobs_.erase(job);
  trim_locked(freed);
}

size_t KvStore::delete_job(const std::string& job, const std::string& prefix) {
  MutexLock lock(mutex_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  auto& keys = it->second;
  if (prefix.empty()) {
    const size_t removed = keys.size();
    erase_job_locked(job);
    return removed;
  }
  size_t removed = 0, freed = 0;
  for (auto k = keys.lower_bound(prefix); k != keys.end() && k->first.compare(0, prefix.size(), prefix) == 0;) {
    const size_t bytes = k->first.size() + k->second.size() + kEntryOverhead;
    release_key_locked(job, k->first, bytes);
    freed += bytes;
    k = keys.erase(k);
    ++removed;
  }
  job_bytes_[job] -= freed;
  total_bytes_ -= freed;
  if (keys.empty()) {
    erase_job_locked(job);
  } else {
    trim_locked(freed);
  }
  return removed;
}

void KvStore::expire_jobs_locked() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> idle;
  for (const auto& [job, when] : touched_) {
    if (now - when < limits_.job_ttl) continue;
    if (!waiters_by_job_.count(job)) idle.push_back(job);
  }
  for (const auto& job : idle) erase_job_locked(job);
}

uint64_t KvStore::get(const std::string& job, std::vector<std::string> keys, std::chrono::milliseconds timeout,
                      GetDone done, const StoreMember& caller) {
  Status refused;
  if (keys.size() > limits_.max_keys_per_get) {
    refused = Status::resource_exhausted("a get may ask for at most " + std::to_string(limits_.max_keys_per_get) +
                                         " keys, not " + std::to_string(keys.size()));
  }
  size_t key_bytes = 0;
  for (size_t i = 0; refused.ok() && i <= keys.size(); ++i) {
    refused = check_names(job, i < keys.size() ? keys[i] : std::string());
    if (i < keys.size()) key_bytes += keys[i].size();
  }
  if (refused.ok()) {
    // A key asked for twice would be copied twice for nothing: the answer's size is bounded
    // by the job's bytes only when every key is distinct.
    std::vector<std::string> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      refused = Status::invalid_argument("a get names a key twice");
    }
  }
  if (!refused.ok()) {
    done(refused, {});
    return 0;
  }
  std::vector<std::string> values;
  {
    MutexLock lock(mutex_);
    if (jobs_.count(job)) touch_locked(job);
    if (!lookup_locked(job, keys, &values)) {
      if (timeout.count() > 0 && !stopping_) {
        size_t& mine = waiters_by_caller_[caller.name];
        size_t& group = waiters_by_group_[caller.group];
        const auto of_job = waiters_by_job_.find(job);
        const size_t job_waiting = of_job == waiters_by_job_.end() ? 0 : of_job->second;
        const bool overall = waiters_.size() >= limits_.max_waiters;
        const bool too_big = waiting_key_bytes_ + key_bytes > limits_.max_waiting_key_bytes;
        const bool job_full = job_waiting >= limits_.max_waiters_per_job;
        const bool group_full = group >= limits_.max_waiters_per_group;
        if (overall || too_big || job_full || group_full || mine >= limits_.max_waiters_per_caller) {
          if (mine == 0) waiters_by_caller_.erase(caller.name);
          if (group == 0) waiters_by_group_.erase(caller.group);
          refused = Status::resource_exhausted(
              overall    ? "the peer store holds " + std::to_string(waiters_.size()) + " waiting gets, its limit overall"
              : too_big  ? "the peer store's waiting gets name " + std::to_string(waiting_key_bytes_) +
                               " bytes of keys, its limit overall"
              : job_full ? "job " + job + " has " + std::to_string(job_waiting) +
                               " waiting gets in the peer store, its limit per job"
              : group_full ? "member group " + caller.group + " has " + std::to_string(group) +
                                 " waiting gets in the peer store, its limit per member group"
                           : "member " + (caller.empty() ? std::string("(unnamed)") : caller.name) + " has " +
                                 std::to_string(mine) + " waiting gets in the peer store, its limit per member");
        } else {
          ++mine;
          ++group;
          ++waiters_by_job_[job];
          waiting_key_bytes_ += key_bytes;
          const uint64_t id = next_waiter_++;
          // Parked under the first key not set yet.
          size_t needs = 0;
          auto present = jobs_.find(job);
          while (present != jobs_.end() && present->second.count(keys[needs])) ++needs;
          park_locked(Waiter{id, job, std::move(keys), std::chrono::steady_clock::now() + timeout, std::move(done),
                             caller, needs});
          changed_.notify_all();
          return id;
        }
      } else {
        values.clear();
      }
    }
  }
  if (!refused.ok()) {
    done(refused, {});
    return 0;
  }
  if (values.size() != keys.size()) {
    done(Status::not_found("job " + job + ": key not set yet"), {});
    return 0;
  }
  done(Status(), std::move(values));
  return 0;
}

void KvStore::cancel(uint64_t id, const Status& why) {
  if (id == 0) return;
  GetDone done;
  {
    MutexLock lock(mutex_);
    if (!waiters_.count(id)) return;
    done = unpark_locked(id).done;
  }
  done(why, {});
}

KvStore::Usage KvStore::usage() {
  MutexLock lock(mutex_);
  return Usage{jobs_.size(), total_bytes_, waiters_.size(), examined_};
}

KvStore::MemberUsage KvStore::usage_of(const StoreMember& member) {
  MutexLock lock(mutex_);
  MemberUsage out;
  if (auto it = members_.find(member.name); it != members_.end()) {
    out.name_bytes = it->second.bytes;
    out.name_keys = it->second.keys;
  }
  if (auto it = groups_.find(member.group); it != groups_.end()) {
    out.group_bytes = it->second.bytes;
    out.group_keys = it->second.keys;
  }
  return out;
}

void KvStore::shutdown(const Status& status) {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  abort_all(status);
}

void KvStore::abort_all(const Status& status) {
  std::map<uint64_t, Waiter> waiters;
  {
    MutexLock lock(mutex_);
    waiters.swap(waiters_);
    needs_.clear();
    deadlines_.clear();
    waiters_by_job_.clear();
    waiters_by_caller_.clear();
    waiters_by_group_.clear();
    waiting_key_bytes_ = 0;
  }
  for (auto& [id, waiter] : waiters) waiter.done(status, {});
}

void KvStore::expire_loop() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    // Wakes for the next get's deadline, and at least every quarter of the job TTL (at most a
    // minute) to forget idle jobs.
    const auto sweep = std::min<std::chrono::steady_clock::duration>(limits_.job_ttl / 4, std::chrono::minutes(1));
    auto next = std::chrono::steady_clock::now() + std::max<std::chrono::steady_clock::duration>(
                                                       sweep, std::chrono::milliseconds(10));
    if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
    changed_.wait_until(lock, next);
    if (stopping_) break;
    expire_jobs_locked();
    const auto now = std::chrono::steady_clock::now();
    std::vector<Waiter> expired;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      expired.push_back(unpark_locked(deadlines_.begin()->second));
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (auto& waiter : expired) {
      std::string names;
      for (const auto& key : waiter.keys) names += (names.empty() ? "" : ", ") + key;
      waiter.done(Status::timeout("job " + waiter.job + ": keys [" + names + "] were not set in time"), {});
    }
    lock.lock();
  }
}

}  // namespace gradsync
