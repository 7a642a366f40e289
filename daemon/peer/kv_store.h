// The peer service's key-value store: keys are scoped by job, values are bytes, a get can wait
// for keys to appear. Thread-safe; gRPC threads call it concurrently.
//
// Waiting gets never block a thread: a get that cannot be answered yet is parked with its
// deadline, and answered by the set()/add() that completes it or by the expiry thread. Callbacks
// run without the store's lock held. A parked get is indexed by the one key it still needs (the
// first of its keys not set yet), so a put looks only at the gets waiting for that key, never at
// every parked get: one caller's thousand parked gets cost another job's puts nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shared/status.h"
#include "shared/mutex.h"

namespace gradsync {

// Who calls, for the store's quotas: `name` is the calling node as the peer service names it
// (the node its proof names, which the caller chooses), `group` what the caller cannot choose
// (its certificate with TLS, else its host). Quotas bound each name, and each group's names
// together, so a member that takes many names stays within its group's share. Empty: nobody
// (the daemon's own writes, tests).
struct StoreMember {
  std::string name;
  std::string group;
  // What a node's place in a job is bound to (key_scope.h): its certificate, or, with a token
  // only, the node its proofs declare. Not its address: a daemon that reconnects over another
  // address (IPv4 after IPv6, a new source address) keeps its place.
  std::string identity;
  StoreMember() = default;
  StoreMember(std::string n, std::string g) : name(std::move(n)), group(std::move(g)), identity(name) {}
  StoreMember(std::string n, std::string g, std::string i)
      : name(std::move(n)), group(std::move(g)), identity(std::move(i)) {}
  StoreMember(const std::string& both) : name(both), group(both), identity(both) {}  // NOLINT: tests name one
  StoreMember(const char* both) : StoreMember(std::string(both)) {}  // NOLINT
  bool empty() const { return name.empty(); }
  bool operator==(const StoreMember&) const = default;
};

class KvStore {
 public:
  using GetDone = std::function<void(const Status&, std::vector<std::string> values)>;

  // Every limit, when hit, refuses the call with kResourceExhausted naming it; nothing that
  // was stored is lost, and the store keeps serving everyone else.
  // What a key (or a job) costs beyond its bytes: its map node and string headers.
  static constexpr size_t kEntryOverhead = 64;

  struct Limits {
    size_t max_value_bytes = 16u << 20;
    size_t max_keys_per_job = 1u << 20;
    size_t max_name_bytes = 1024;  // job ids and keys
    size_t max_jobs = 1u << 16;
    size_t max_job_bytes = 64u << 20;     // keys and values of one job
    size_t max_total_bytes = 512u << 20;  // of every job together
    size_t max_keys_per_get = 4096;       // distinct keys
    size_t max_waiting_key_bytes = 64u << 20;  // the keys every waiting get names, together
    size_t max_waiters = 8192;            // parked gets, overall
    size_t max_waiters_per_caller = 1024; // parked gets of one member name (StoreMember)
    size_t max_waiters_per_group = 2048;  // ... of one member group
    size_t max_waiters_per_job = 4096;    // parked gets about one job
    // What the keys a member set (over every job) may hold, per name and per group. A job is
    // made by its first key, so the keys bound also bounds the jobs one group can make, well
    // under max_jobs.
    size_t max_member_bytes = 32u << 20;
    size_t max_member_keys = 1u << 14;
    size_t max_group_bytes = 128u << 20;
    size_t max_group_keys = 1u << 15;
    // A job whose keys nobody set, added to or asked for this long (and with no get waiting)
    // is forgotten: a job whose nodes never all ended (one was killed) does not stay forever.
    std::chrono::seconds job_ttl{24 * 3600};
  };

  explicit KvStore(Limits limits);
  KvStore() : KvStore(Limits{}) {}
  ~KvStore();  // answers every parked get with kAborted
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // `member`: who sets it (Limits), charged for the key until it is deleted or another member
  // sets it; empty: nobody's (the daemon's own, tests).
  Status set(const std::string& job, const std::string& key, std::string value, const StoreMember& member = {});
  // Stores `value` only if `key` has no value yet (*stored says which); the first writer wins.
  Status set_if_absent(const std::string& job, const std::string& key, std::string value, bool* stored,
                       const StoreMember& member = {});

  // Adds delta to the counter at key (absent counts as 0) and stores the decimal result.
  Status add(const std::string& job, const std::string& key, int64_t delta, int64_t* result,
             const StoreMember& member = {});

  // Whether `member` has room for `keys` more keys of `bytes` in all (values and keys):
  // checked before a call's side effects (a node claim writes three keys), so a member at its
  // quota leaves nothing behind.
  Status check_room(const StoreMember& member, size_t bytes, size_t keys);

  // Removes exactly job/key (a call's side effect undone); whether it was there.
  bool erase(const std::string& job, const std::string& key);

  // The value of job/key, if there is one, without waiting or counting as a use.
  bool peek(const std::string& job, const std::string& key, std::string* value);

  // How many of the job's keys start with `prefix`.
  size_t count_prefix(const std::string& job, const std::string& prefix);

  // Removes the job's keys that start with `prefix` (every key when empty); the count removed.
  size_t delete_job(const std::string& job, const std::string& prefix = {});

  // Answers done(ok, values) once every key exists; with timeout 0, at once with kNotFound for
  // a missing key; otherwise with kTimeout at the deadline. `caller` (the member, Limits) is
  // what the per-member bound on parked gets counts. Returns the parked get's id for cancel(),
  // or 0 when it was answered at once.
  uint64_t get(const std::string& job, std::vector<std::string> keys, std::chrono::milliseconds timeout, GetDone done,
               const StoreMember& caller = {});

  // Answers the parked get `id` with `why` and frees it now (its caller went away); a no-op
  // when it was answered already.
  void cancel(uint64_t id, const Status& why);

  // What the store holds, for tests and status.
  struct Usage {
    size_t jobs = 0, bytes = 0, waiters = 0;
    uint64_t waiters_examined = 0;  // parked gets that puts looked at, ever (the index's cost)
  };
  Usage usage();
  // What a member's keys hold, by its name and by its group (tests).
  struct MemberUsage {
    size_t name_bytes = 0, name_keys = 0, group_bytes = 0, group_keys = 0;
  };
  MemberUsage usage_of(const StoreMember& member);

  // Answers every parked get with `status`; the store keeps working.
  void abort_all(const Status& status);

  // Answers every parked get with `status` and parks no more (server shutdown): a get that
  // arrives later is answered at once.
  void shutdown(const Status& status);

 private:
  struct Waiter {
    uint64_t id = 0;
    std::string job;
    std::vector<std::string> keys;
    std::chrono::steady_clock::time_point deadline;
    GetDone done;
    StoreMember caller;
    size_t needs = 0;  // index of the key it waits for; the keys before it were set when looked at
  };
  using Ready = std::vector<std::pair<GetDone, std::vector<std::string>>>;
  using JobKey = std::pair<std::string, std::string>;

  Status check_names(const std::string& job, const std::string& key) const;
  Status put(const std::string& job, const std::string& key, std::string value, bool if_absent, bool* stored,
             const StoreMember& member);
  // The slot for job/key, made room for `bytes` of value (created within the limits), charged
  // to `member`.
  Status slot_locked(const std::string& job, const std::string& key, size_t bytes, const StoreMember& member,
                     std::string** slot) GS_REQUIRES(mutex_);
  // Moves the charge for a key between members (either may be empty: nobody); false when
  // `to` would pass its limits (nothing changed then; *why says which).
  bool charge_locked(const StoreMember& from, const StoreMember& to, size_t old_bytes, size_t new_bytes, bool is_new,
                     Status* why) GS_REQUIRES(mutex_);
  // Whether `to` may take a key of `new_bytes` from `from` (whose charge is `old_bytes`).
  Status room_locked(const StoreMember& from, const StoreMember& to, size_t old_bytes, size_t new_bytes,
                     bool is_new) const GS_REQUIRES(mutex_);
  // Adds (or with `sign` -1 removes) a key of `bytes` to a member's name and group.
  void count_locked(const StoreMember& member, size_t bytes, int sign) GS_REQUIRES(mutex_);
  // Credits the owner of job/key (if any) for a key of `bytes` that goes.
  void release_key_locked(const std::string& job, const std::string& key, size_t bytes) GS_REQUIRES(mutex_);
  void forget_waiter_locked(const Waiter& waiter) GS_REQUIRES(mutex_);
  void touch_locked(const std::string& job) GS_REQUIRES(mutex_) { touched_[job] = std::chrono::steady_clock::now(); }
  void erase_job_locked(const std::string& job) GS_REQUIRES(mutex_);
  void expire_jobs_locked() GS_REQUIRES(mutex_);
  // Hands memory that a large delete freed back to the system.
  void trim_locked(size_t freed) GS_REQUIRES(mutex_);
  bool lookup_locked(const std::string& job, const std::vector<std::string>& keys, std::vector<std::string>* values) const GS_REQUIRES(mutex_);
  // Parks `waiter` under the first key it still needs (it needs one: the caller looked).
  void park_locked(Waiter waiter) GS_REQUIRES(mutex_);
  // The gets waiting for job/key, which was just set: each answered (into the result) or parked
  // under its next missing key.
  Ready wake_locked(const std::string& job, const std::string& key) GS_REQUIRES(mutex_);
  // Removes a parked get from every index; returns it.
  Waiter unpark_locked(uint64_t id) GS_REQUIRES(mutex_);
  void expire_loop();

  Limits limits_;
  Mutex mutex_;
  CondVar changed_;
  std::map<std::string, std::map<std::string, std::string>> jobs_ GS_GUARDED_BY(mutex_);
  // Parked gets by id, by the key each waits for, by deadline and by job.
  std::map<uint64_t, Waiter> waiters_ GS_GUARDED_BY(mutex_);
  std::map<JobKey, std::set<uint64_t>> needs_ GS_GUARDED_BY(mutex_);
  std::multimap<std::chrono::steady_clock::time_point, uint64_t> deadlines_ GS_GUARDED_BY(mutex_);
  std::map<std::string, size_t> waiters_by_job_ GS_GUARDED_BY(mutex_);
  uint64_t examined_ GS_GUARDED_BY(mutex_) = 0;
  std::map<std::string, size_t> job_bytes_ GS_GUARDED_BY(mutex_);
  std::map<std::string, std::chrono::steady_clock::time_point> touched_ GS_GUARDED_BY(mutex_);
  size_t total_bytes_ GS_GUARDED_BY(mutex_) = 0;
  size_t waiting_key_bytes_ GS_GUARDED_BY(mutex_) = 0;
  std::map<std::string, size_t> waiters_by_caller_ GS_GUARDED_BY(mutex_);  // by name
  std::map<std::string, size_t> waiters_by_group_ GS_GUARDED_BY(mutex_);
  struct MemberUse {
    size_t bytes = 0, keys = 0;
  };
  std::map<std::string, MemberUse> members_ GS_GUARDED_BY(mutex_);  // what each name's keys hold
  std::map<std::string, MemberUse> groups_ GS_GUARDED_BY(mutex_);  // ... each group's
  std::map<JobKey, StoreMember> owners_ GS_GUARDED_BY(mutex_);  // who set each key (members only)
  uint64_t next_waiter_ GS_GUARDED_BY(mutex_) = 1;
  bool stopping_ GS_GUARDED_BY(mutex_) = false;
  std::thread expiry_;
};

}  // namespace gradsync
