// The per-job worker: the `_process_batch` analogue. One thread per job drains the job's
// submission rings, matches the n-th operation of every local client, launches buckets strictly
// in index order once every local client has marked all of a bucket's tensors ready, hands each
// to the BucketExecutor of the set's memory kind, and posts one completion per operation to each
// client. It knows no concrete backend or engine: executors come from the BackendFactory and
// engines from the Cluster.
//
// One bucket of a job is in flight at a time. While it executes, the worker keeps draining the
// rings and watching its deadlines; the executor's answer comes back as a task.
//
// Two bounds, each named in its error:
//   - the job timeout bounds waiting: for a local rank to submit or mark a bucket ready, counted
//     from when the worker could first have launched it (the engines bound waiting for peers
//     with the same timeout);
//   - the execution bound (--execution-timeout-ms) bounds one bucket in flight, however long
//     it legitimately takes to move its bytes, so that only a hang trips it.
//
// The worker's parts, each in its own file: LocalClients (local_clients.h) holds the clients'
// rings; OpQueue (op_queue.h) matches the local clients'
// submissions and tracks readiness; BucketFlight (flight.h) holds the bucket in flight and the
// executor's answer; SettingsSchedule (settings_schedule.h) decides from which operation a
// settings change applies, across nodes; ReplanCache (replan.h) re-plans sets for a new bucket
// cap. The worker itself drains the rings, launches and lands buckets, keeps the deadlines and
// shuts the job's per-step path down.
//
// Failure: the first error sticks. fail() (from any thread) or an error found by the worker
// itself (bad ring entry, mismatched operations, a bound) ends the job's per-step path: the
// executors and the cluster's engines are aborted, the worker publishes the error in every
// client's rings, posts it as the completion of every pending operation, wakes every client,
// waits for the bucket in flight to come back (promptly, because it was aborted), and exits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/backend/executor.h"
#include "daemon/backend/factory.h"
#include "daemon/job/reports.h"
#include "daemon/job/channel.h"
#include "daemon/job/stats.h"
#include "daemon/job/cluster.h"
#include "daemon/job/flight.h"
#include "daemon/job/job_settings.h"
#include "daemon/job/local_clients.h"
#include "daemon/job/op.h"
#include "daemon/job/op_queue.h"
#include "daemon/job/replan.h"
#include "daemon/job/settings_schedule.h"
#include "daemon/job/trace.h"
#include "daemon/model/tensor_set.h"
#include "daemon/model/topology.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_pool.h"
#include "shared/channel_layout.h"
#include "shared/mutex.h"
#include "shared/status.h"

namespace gradsync {

struct WorkerOptions {
  std::string job_id;
  std::string owner_job;  // "<uid>.<job id>": the job's identity across generations
  Topology topology;
  std::unique_ptr<Cluster> cluster;  // null for a single-node job
  std::chrono::milliseconds timeout{30'000};             // the job timeout: waiting
  std::chrono::milliseconds execution_timeout{600'000};  // one bucket in flight
  std::shared_ptr<JobDoorbell> doorbell;  // the worker sleeps on it
  BackendFactory* backends = nullptr;     // makes the executors; outlives the worker
  IntegrityCheck integrity;               // handed to the host executor
  ThreadPool* pool = nullptr;             // given to the executors
  // Called once, on the worker thread, when the per-step path stops because of a failure the
  // worker found itself or was told about: after the bucket in flight is back, before any
  // client is told.
  std::function<void(const Status&)> on_stopped;
  Logger log;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();  // stops and joins the thread
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Makes a locally committed set available to operations, once every node agrees on it (a
  // multi-node job checks layouts and forms its engines first, on the worker thread). Calls
  // done exactly once, on the worker thread: ok, or the error that failed the job.
  // Thread-safe.
  void admit_set(std::shared_ptr<const TensorSet> set, std::function<void(const Status&)> done);

  // Forgets a set every local client released: later operations on it are refused; those
  // submitted already hold it and finish. Thread-safe.
  void retire_set(uint32_t set_id);

  // A client joined as `local_rank`: the worker starts draining its rings. If the job has
  // already failed, the client's rings get the failure at once. Thread-safe.
  void attach_client(uint32_t local_rank, std::shared_ptr<ClientChannel> channel);

  // Ends the job with `status` unless it already failed; returns at once. Thread-safe.
  void fail(Status status);

  // Stops the thread and waits for it; pending operations fail with `status` first.
  void stop(Status status);

  // The sticky error, ok while the job is healthy. Thread-safe.
  Status failure() const;

  // Operations completed so far, for status queries.
  uint64_t completed_ops() const { return completed_ops_.load(); }

  // Operations submitted by some rank and not yet completed.
  size_t pending_ops() const { return pending_ops_.load(); }

  // The operations not finished yet, and which local ranks have not submitted them or marked
  // which buckets ready (the admin service's GetInFlight). `done` runs once, on the worker
  // thread (empty when the job has failed). Thread-safe.
  void in_flight(std::function<void(std::vector<PendingOperation>)> done);

  // Running statistics (GetStats). Thread-safe.
  std::shared_ptr<const JobStats> stats() const { return stats_; }

  // The last operations, for DumpTrace. Thread-safe.
  std::shared_ptr<const TraceLog> trace() const { return trace_; }

  // Where the job is, for other nodes asking through the peer service (GetInFlight there).
  // Thread-safe; a moment's view.
  struct Position {
    uint64_t operations_done = 0;
    uint64_t current_seq = 0;      // the head operation; 0 when none is pending
    uint32_t current_bucket = 0;   // its next bucket to launch, or the one in flight
    bool executing = false;        // current_bucket is in flight
  };
  Position position() const;

  // A multi-node job's other daemons, by node, once it formed (empty before, and for a
  // single-node job). Thread-safe.
  std::vector<std::string> node_addresses() const;

  // Changes the job's settings from the first operation that has not begun on any of its
  // nodes: at once for a single-node job; for a multi-node job through the rendezvous
  // (config_channel.h), which every node's watcher follows. Blocks up to `bound`; *from_seq is
  // the first operation run with the new settings. Thread-safe; not on the worker thread.
  Status change_settings(const JobSettings& settings, std::chrono::milliseconds bound, uint64_t* from_seq);

 private:
  // A unit of work for the worker thread: called with ok to run, or with the job's failure
  // when the worker stops before it ran.
  using Task = std::function<void(const Status&)>;
  void post_task(Task task) GS_EXCLUDES(mutex_);
  void run_tasks(bool last = false) GS_EXCLUDES(mutex_);
  void formed() GS_EXCLUDES(mutex_);  // a multi-node job met its nodes: start following settings

  void run();
  // The loop of run(): tasks, rings, progress, until the job fails or stops.
  void serve();
  bool drain_rings();  // true when an entry was consumed
  Status handle_entry(uint32_t local_rank, const SubmitEntry& entry);
  Status handle_submit(uint32_t local_rank, const SubmitEntry& entry);
  Status progress();  // progress_ops(), then publishes position()
  Status progress_ops();  // lands the bucket in flight, launches the next ready one, completes ops
  // Before an operation's first bucket: applies the settings scheduled up to its sequence
  // number, re-planning its set when the bucket cap changed. False while a settings change
  // holds the job before it.
  bool begin(Op& op);
  Status launch(Op& op);
  Status land(Op& op);  // the executor answered for the bucket in flight
  void complete(Op& op);  // every bucket landed: the clients are told, the queue moves on
  // A released set with no operation left: its executor lets go of what it kept for it.
  void retire_in_executor(const TensorSet& set) GS_EXCLUDES(mutex_);
  // Lets every executor tidy (BucketExecutor::tidy) before the worker sleeps, between launches.
  void tidy_executors() GS_EXCLUDES(mutex_);
  std::chrono::steady_clock::time_point execution_deadline() const;  // of the flight
  BucketExecutor* executor_for(MemoryKind kind, Status* status) GS_EXCLUDES(mutex_);
  Status check_deadline();
  void post(uint32_t local_rank, uint64_t seq, const Status& status, const reduce::Health* health = nullptr);
  // The fused health of a completed operation (desc.health), per local rank.
  std::vector<reduce::Health> fold_health(const Op& op) const;
  void shut_down(const Status& status);  // worker thread only
  // Waits, up to the job timeout, for device work to stop touching the clients' memory; what
  // the clients must be told. Memory that GPU work may still touch is handed to the backends to
  // keep mapped until the daemon exits.
  Status drain_executors(const Status& failure) GS_EXCLUDES(mutex_);
  void release_cluster(const Status& status) GS_EXCLUDES(mutex_);
  std::shared_ptr<const TensorSet> find_set(uint32_t id) GS_EXCLUDES(mutex_);
  bool was_retired(uint32_t id) GS_EXCLUDES(mutex_);
  std::string who(uint32_t local_rank) const { return local_rank_name(options_.topology, local_rank); }

  WorkerOptions options_;
  WakeWord& doorbell() { return options_.doorbell->page()->doorbell; }

  // Worker thread only: the clients by local rank (empty until joined), the pending operations,
  // the bucket in flight, the settings in force, and the re-planned sets.
  LocalClients clients_;
  std::shared_ptr<JobStats> stats_ = std::make_shared<JobStats>(options_.topology.local_world_size);
  OpQueue ops_{options_.job_id, &options_.topology, stats_.get()};
  BucketFlight flight_{options_.doorbell};
  JobSettings active_;
  ReplanCache replans_;
  std::chrono::steady_clock::time_point last_work_;  // last consumed entry

  // Read by other threads as a moment's view.
  std::atomic<uint64_t> completed_ops_{0};
  std::atomic<size_t> pending_ops_{0};
  std::atomic<uint64_t> current_seq_{0};
  std::atomic<uint32_t> current_bucket_{0};
  std::atomic<bool> executing_{false};
  std::shared_ptr<TraceLog> trace_ = std::make_shared<TraceLog>();

  mutable Mutex mutex_;
  std::map<uint32_t, std::shared_ptr<const TensorSet>> sets_ GS_GUARDED_BY(mutex_);
  std::set<uint32_t> retired_sets_ GS_GUARDED_BY(mutex_);  // released ones: named so in refusals
  // Released sets whose operations had not all completed at their release (worker thread only).
  std::set<uint32_t> awaiting_retire_;
  // Released device sets, for drain_executors to keep mapped if the executor still holds them.
  std::vector<std::weak_ptr<const TensorSet>> retired_device_sets_ GS_GUARDED_BY(mutex_);
  std::deque<Task> tasks_ GS_GUARDED_BY(mutex_);
  bool exited_ GS_GUARDED_BY(mutex_) = false;  // later tasks run at once with the failure
  std::atomic<bool> has_tasks_{false};
  Status failure_ GS_GUARDED_BY(mutex_);
  bool cluster_released_ GS_GUARDED_BY(mutex_) = false;
  // Created on the worker thread, aborted from any thread.
  std::map<MemoryKind, std::unique_ptr<BucketExecutor>> executors_ GS_GUARDED_BY(mutex_);
  LocalRendezvous local_;  // a single-node job's rendezvous, for executors' admit()
  std::atomic<bool> failed_{false};
  std::atomic<bool> stopping_{false};
  bool stopped_told_ = false;  // shut_down() told the job (on_stopped); worker thread only
  std::vector<std::string> node_addresses_ GS_GUARDED_BY(mutex_);
  // Settings changes; its watcher calls fail(), so it goes before the members fail() uses.
  SettingsSchedule settings_;
  std::thread thread_;
};

}  // namespace gradsync
