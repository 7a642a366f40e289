// A job: the local clients of one training run on this node, of one user. The Job owns the job's
// doorbell, creates each client's rings when it joins, owns its Worker, admits clients, runs the registration barrier of
// every tensor set, and turns a lost client into the job's sticky error.
//
// Threading: every method runs on the daemon's io thread; the Worker has its own thread and is
// reached only through its thread-safe methods.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/backend/factory.h"
#include "daemon/util/local_limits.h"
#include "daemon/util/setup_threads.h"
#include "daemon/engine/factory.h"
#include "daemon/job/daemon_counters.h"
#include "daemon/job/join_validation.h"
#include "daemon/job/progress_board.h"
#include "daemon/job/reaper.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"
#include "daemon/job/worker.h"
#include "daemon/peer/peer_auth.h"
#include "daemon/peer/rendezvous_store.h"
#include "daemon/rendezvous/store_opener.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_pool.h"
#include "daemon/model/memory.h"
#include "daemon/job/channel.h"
#include "shared/status.h"

namespace gradsync {

// How this daemon takes part in multi-node jobs (from its configuration).
struct ClusterSettings {
  std::string advertise;        // host:port of this daemon's peer service, as others reach it
  HostEngineFactory* engines = nullptr;  // the engines of groups that span nodes
  // How this daemon proves to its peers that it belongs to the cluster; multi-node jobs are
  // refused without it.
  std::shared_ptr<const PeerAuth> auth;
  // Opens the store a multi-node job's rendezvous names (node 0's daemon, or etcd); null in
  // tests: the rendezvous is node 0's daemon.
  std::shared_ptr<const StoreOpener> stores;
};

// How this daemon executes buckets (from its configuration).
struct ExecutionSettings {
  BackendFactory* backends = nullptr;  // the executor of each memory kind
  std::chrono::milliseconds timeout{600'000};  // bound on one bucket in flight
  IntegrityCheck integrity;                    // --integrity-check-every (backend/executor.h)
};

// What every job of this daemon uses from it: handed by the registry to each job it forms as
// one value, not field by field.
struct JobServices {
  boost::asio::io_context* io = nullptr;
  ThreadPool* pool = nullptr;
  ClusterSettings cluster;
  Reaper* reaper = nullptr;  // stops the worker when the job ends, off the io thread
  ExecutionSettings execution;
  Logger log;
  DaemonCounters* failures = nullptr;  // daemon-wide; may be null (tests)
  ProgressBoard* progress = nullptr;  // daemon-wide; multi-node jobs are on it; may be null
  SetupThreads* setup = nullptr;  // checks and plans complete sets; null: inline (tests)
};

struct JobOptions {
  JobParams params;
  uint64_t incarnation = 0;  // distinguishes re-formed jobs with the same id in logs
  JobServices services;
  // The job's doorbell, made off the io thread by the join that forms the job; null: the Job
  // makes it (tests).
  std::shared_ptr<JobDoorbell> doorbell;
  // The job's place against the job limits, given back once the reaper retired it.
  std::shared_ptr<UserCounts::Ticket> ticket;
  // A multi-node job's rendezvous store, opened by the join that forms the job; null: node 0's
  // daemon at params.rendezvous (tests).
  std::shared_ptr<RendezvousStore> store;
};

struct MemberInfo {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  uid_t uid = 0;
};

// One client's registration of a tensor set, with addresses already resolved and checked
// against the client's own segments.
struct SetRegistration {
  uint32_t set_id = 0;
  std::string label;  // how messages name the set (shared/set_name.h); the first rank's is kept
  std::vector<plan::TensorLayout> layout;
  std::vector<std::byte*> address;
  std::byte* gather_output = nullptr;  // nullptr: no allgather on this set
  std::byte* shard_output = nullptr;   // nullptr: no reduce-scatter on this set
  std::shared_ptr<const std::vector<uint64_t>> mask;  // null: no mask (TensorSet::mask)
  uint64_t bucket_cap = plan::kDefaultBucketCapBytes;
  std::vector<std::shared_ptr<const MemoryRegion>> regions;
  std::shared_ptr<const ClientEvents> events;  // device sets: the client's event rings
  // Called once: with the committed set, or with the error (mismatch, timeout, job failure).
  std::function<void(const Status&, const TensorSet*)> done;
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  // Creates the doorbell and starts the worker. Throws Error when the memory cannot be created.
  explicit Job(JobOptions options);
  ~Job();  // retires it, if the registry has not
  // Moves what the job did into the daemon's counters (daemon_counters.h), once: called when
  // the registry lets go of it, since a failed job may live on while its members stay, and a
  // daemon-wide counter must never go back.
  void retire();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobParams& params() const { return options_.params; }
  // "<uid>.<job id>": the job's name in the rendezvous store and on the progress board.
  std::string store_job() const { return std::to_string(options_.params.uid) + "." + options_.params.id; }
  uint64_t incarnation() const { return options_.incarnation; }
  // The descriptors a member gets: the job's doorbell and its own rings (channel_layout.h).
  struct ChannelFds {
    UniqueFd doorbell;
    UniqueFd client_rings;
    UniqueFd daemon_rings;
  };

  // Checks the member against the job (rank ranges, duplicates) and records it, with `channel`
  // as its rings (made off the io thread by the caller: a job's memory grows with the clients
  // that actually join, never with the declared local world size).
  Status admit(const MemberInfo& member, std::shared_ptr<ClientChannel> channel, ChannelFds* fds);

  // A member went away (disconnect, kill, re-join). A healthy job fails with `why`.
  void leave(int local_rank, const Status& why);

  // Adds a registration to the set's barrier; completes every registrant's callback once the
  // last local client registered (or on mismatch, timeout or failure).
  void register_set(int local_rank, SetRegistration registration);

  // The client at `local_rank` will not use set `set_id` again (its `tensors`, the set's
  // tensor count, back to its budget). Once every local client released it, the set leaves the
  // job and the worker (operations already submitted on it finish first). Refused, naming why,
  // for a set not committed here or released by this client already.
  Status release_set(int local_rank, uint32_t set_id, uint64_t* tensors);

  // True once every admitted member has left.
  bool empty() const;

  // The job's sticky error; ok while healthy.
  Status failure() const;

  // Ends the job with `status` (first error wins) and releases every client's mappings.
  void fail(const Status& status);

  // For the admin service.
  JobInfo info() const;
  std::shared_ptr<const JobStats> stats() const { return worker_->stats(); }
  std::shared_ptr<const TraceLog> trace() const { return worker_->trace(); }
  // The worker, for admin calls that block (a settings change) and must not hold the Job,
  // which belongs to the io thread.
  std::shared_ptr<Worker> worker() const { return worker_; }
  // Its operations not finished yet; `done` runs once, on the worker thread.
  void in_flight(std::function<void(std::vector<PendingOperation>)> done) const {
    worker_->in_flight(std::move(done));
  }

 private:
  // What a registration meets once the job failed: the failure's code, naming the job.
  Status failed_status() const;
  struct PendingSet {
    std::map<int, SetRegistration> by_local_rank;
    std::unique_ptr<boost::asio::steady_timer> deadline;
    uint64_t serial = 0;  // tells a stale timer handler from this barrier's own
  };

  // The barrier of `set_id` is complete: checks and plans it off the io thread, then committed().
  void commit(uint32_t set_id);
  void committed(uint32_t set_id, Status status, std::shared_ptr<TensorSet> set, std::map<int, SetRegistration> regs);
  void expire(uint32_t set_id, uint64_t serial);
  void fail_pending(const Status& status);
  std::string describe_member(int local_rank) const;

  JobOptions options_;
  std::shared_ptr<Job*> alive_ = std::make_shared<Job*>(this);  // cleared by the destructor
  Logger log_;
  std::shared_ptr<JobDoorbell> doorbell_;
  std::vector<std::optional<MemberInfo>> members_;  // by local rank; nullopt: not joined or left
  std::map<uint32_t, PendingSet> pending_;
  uint64_t next_serial_ = 1;
  std::map<uint32_t, std::shared_ptr<const TensorSet>> committed_;
  std::set<uint32_t> committing_;  // complete barriers being checked and planned
  std::map<uint32_t, std::set<int>> released_;  // committed sets some local clients released
  std::set<uint32_t> released_ids_;  // sets every local client released: never registered again
  // The event rings of released device sets, by local rank: kept until that client leaves.
  std::map<int, std::vector<std::shared_ptr<const ClientEvents>>> released_events_;
  Status failure_;
  bool failed_with_work_ = false;  // it failed with operations or registrations pending
  bool retired_ = false;           // its totals moved into the daemon's counters
  std::shared_ptr<Worker> worker_;
  std::chrono::steady_clock::time_point formed_ = std::chrono::steady_clock::now();
};

}  // namespace gradsync
