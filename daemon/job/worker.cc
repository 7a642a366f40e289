#include "daemon/job/worker.h"

#include <algorithm>

namespace gradsync {
namespace {

// The worker re-checks its stop flag at least this often even if a hostile client scribbles
// over the doorbell's waiter count and a wake-up is lost.
constexpr auto kWakeSlice = std::chrono::milliseconds(200);

// The worker polls its rings before sleeping (wake_word.h's Polling: 20 looks at every
// client's ring, each after a pause, then 100 each after a sched_yield), but only within
// kPollAfterWork of its last work: tens of microseconds, so a trainer marking tensors ready one
// by one does not pay a futex wake-up per tensor, and an idle daemon never spins. Longer
// pause-polling (1000 checks) cost the 2-client 4 KiB round trip on a 2-core machine, where the
// polling worker held a core the clients needed; a yield hands the core over instead.
constexpr Polling kPollAfterWorkFor{20, 100};
constexpr auto kPollAfterWork = std::chrono::milliseconds(1);

}  // namespace

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)),
      clients_(static_cast<size_t>(options_.topology.local_world_size)),
      settings_(SettingsScheduleOptions{
          options_.job_id,
          std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(60)),
          [this](const Status& why) { fail(why); },
          [this] { return failed_.load(); },
          [this] { doorbell().notify(); },
          options_.log,
      }) {
  thread_ = std::thread([this] { run(); });
  // A multi-node job meets its other nodes as soon as it exists, not at its first set: then a
  // node whose trainers are late is known to be there (and reported as slow, not gone).
  if (options_.cluster) {
    post_task([this](const Status& failed) {
      if (failed.ok()) formed();
    });
  }
}

void Worker::formed() {
  if (Status status = options_.cluster->form(); !status.ok()) return fail(status);
  {
    MutexLock lock(mutex_);
    node_addresses_ = options_.cluster->node_addresses();
  }
  if (std::shared_ptr<ConfigChannel> channel = options_.cluster->config_channel()) settings_.follow(channel);
}

Worker::~Worker() { stop(Status::aborted("job " + options_.job_id + " is shutting down")); }

void Worker::post_task(Task task) {
  {
    MutexLock lock(mutex_);
    if (exited_) {
      const Status failure = failure_;
      lock.unlock();
      task(failure);
      return;
    }
    tasks_.push_back(std::move(task));
    has_tasks_.store(true);
  }
  doorbell().notify();
}

void Worker::in_flight(std::function<void(std::vector<PendingOperation>)> done) {
  post_task([this, done = std::move(done)](const Status& failed) {
    if (!failed.ok()) return done({});
    done(ops_.report(flight_.active()));
  });
}

void Worker::run_tasks(bool last) {
  for (;;) {
    Task task;
    {
      MutexLock lock(mutex_);
      if (tasks_.empty()) {
        has_tasks_.store(false);
        if (last) exited_ = true;
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task(failed_.load() ? failure() : Status());
  }
}

void Worker::attach_client(uint32_t local_rank, std::shared_ptr<ClientChannel> channel) {
  post_task([this, local_rank, channel](const Status& failed) {
    if (!failed.ok()) {
      channel->publish_failure(failed);
      channel->completion_ready().notify();
      return;
    }
    clients_.attach(local_rank, channel);
  });
}

void Worker::admit_set(std::shared_ptr<const TensorSet> set, std::function<void(const Status&)> done) {
  post_task([this, set, done](const Status& failed) {
    if (!failed.ok()) return done(failed);
    Status status = options_.cluster ? prepare_set(*options_.cluster, *set) : Status();
    if (status.ok()) {
      BucketExecutor* executor = executor_for(set->memory_kind, &status);
      SetAdmission admission;
      admission.job = options_.job_id;
      admission.owner_job = options_.owner_job;
      admission.rendezvous = options_.cluster ? static_cast<Rendezvous*>(options_.cluster.get()) : &local_;
      admission.topology = &options_.topology;
      admission.timeout = options_.timeout;
      admission.execution_timeout = options_.execution_timeout;
      if (executor) status = executor->admit(*set, admission);
    }
    if (status.ok()) {
      MutexLock lock(mutex_);
      sets_[set->id] = set;
    } else {
      // The job's first error is the answer: a wait cancelled because the job failed or the
      // daemon stops reports that, not the cancelled wait.
      fail(status);
      status = failure();
    }
    done(status);
  });
}

void Worker::retire_set(uint32_t set_id) {
  // After admit_set's task for the set (tasks run in order), so an admission in progress is
  // not undone by it.
  post_task([this, set_id](const Status& failed) {
    if (!failed.ok()) return;
    // Each client wrote its last submissions on the set to its ring before it sent its Release
    // on the control socket; the worker reads tasks before rings, so those may still be unread.
    // Read now, they are admitted holding the set, and finish; later ones are refused.
    drain_rings();
    std::shared_ptr<const TensorSet> set;
    {
      MutexLock lock(mutex_);
      auto it = sets_.find(set_id);
      if (it == sets_.end()) return;
      set = std::move(it->second);
      sets_.erase(it);
      retired_sets_.insert(set_id);
      if (set->memory_kind != MemoryKind::kHostMemfd) {
        // GPU work of its last operations may outlive them (answered once queued): a drain
        // that fails must still keep it mapped (drain_executors).
        std::erase_if(retired_device_sets_, [](const auto& weak) { return weak.expired(); });
        retired_device_sets_.push_back(set);
      }
    }
    retire_in_executor(*set);
  });
}

void Worker::tidy_executors() {
  std::vector<BucketExecutor*> executors;
  {
    MutexLock lock(mutex_);
    for (auto& [kind, executor] : executors_) executors.push_back(executor.get());
  }
  for (BucketExecutor* executor : executors) executor->tidy();
}

void Worker::retire_in_executor(const TensorSet& set) {
  // Once its last operation completed: until then the executor still serves it. Worker thread.
  for (const Op& op : ops_) {
    if (op.set->id == set.id) {
      awaiting_retire_.insert(set.id);  // complete() comes back to it
      return;
    }
  }
  awaiting_retire_.erase(set.id);
  BucketExecutor* executor = nullptr;
  {
    MutexLock lock(mutex_);
    auto it = executors_.find(set.memory_kind);
    if (it != executors_.end()) executor = it->second.get();
  }
  if (executor) executor->retire_set(set.id);
}

std::shared_ptr<const TensorSet> Worker::find_set(uint32_t id) {
  MutexLock lock(mutex_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

bool Worker::was_retired(uint32_t id) {
  MutexLock lock(mutex_);
  return retired_sets_.count(id) != 0;
}

void Worker::fail(Status status) {
  {
    MutexLock lock(mutex_);
    if (!failure_.ok()) return;
    failure_ = std::move(status);
    // A worker blocked in a cross-node collective returns promptly instead of at the engine's
    // timeout: that is what bounds job failure and daemon shutdown.
    if (options_.cluster && !cluster_released_) options_.cluster->abort(failure_);
    for (auto& [kind, executor] : executors_) executor->abort(failure_);
  }
  failed_.store(true);
  doorbell().notify();
}

void Worker::stop(Status status) {
  fail(std::move(status));
  stopping_.store(true);
  doorbell().notify();
  if (thread_.joinable()) thread_.join();
}

Status Worker::failure() const {
  MutexLock lock(mutex_);
  return failure_;
}

void Worker::run() {
  // Whatever the loop throws (memory ran out: a set's buffers, an operation's bookkeeping) fails
  // this job, naming it, and the worker still shuts down as after any failure; escaping the
  // thread would end the daemon and every other job with it.
  const auto failed_with = [this](const char* where) {
    const Status why = Status::internal("job " + options_.job_id + ": the job's worker " + where + ": " +
                                        current_exception_text());
    try {
      options_.log.error(why.to_string());
    } catch (...) {
    }
    return why;
  };
  try {
    serve();
  } catch (...) {
    fail(failed_with("failed"));
  }
  try {
    shut_down(failure());
  } catch (...) {
    failed_with("failed while shutting down");
    // Best effort, for what shut_down() may not have reached: the job and its clients must
    // still learn that it failed, or they would wait for it.
    try {
      if (!stopped_told_ && options_.on_stopped) options_.on_stopped(failure());
    } catch (...) {
    }
    try {
      clients_.publish_failure(failure());
      clients_.wake_all();
    } catch (...) {
    }
  }
}

void Worker::serve() {
  while (!failed_.load()) {
    if (has_tasks_.load()) run_tasks();
    if (failed_.load()) break;
    const bool consumed = drain_rings();
    if (failed_.load()) break;
    Status status = progress();
    if (status.ok()) status = check_deadline();
    if (!status.ok()) {
      fail(status);
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (consumed) {
      last_work_ = now;
      continue;
    }
    if (!flight_.active()) tidy_executors();
    // Sleep until a client rings the doorbell, the executor answers, the bound of whatever the
    // worker is waiting for, or a slice. Shortly after work, poll a little first: a trainer
    // marking tensors ready one by one, or the next small step, then arrives without a futex
    // wake-up per entry; an idle worker does not poll at all.
    const Polling polling = now - last_work_ < kPollAfterWork ? kPollAfterWorkFor : Polling{};
    auto deadline = now + kWakeSlice;
    if (flight_.active()) {
      deadline = std::min(deadline, execution_deadline());
    } else if (!ops_.empty()) {
      deadline = std::min(deadline, ops_.front().waiting_since + options_.timeout);
    }
    doorbell().wait_until(
        [&] {
          if (failed_.load() || has_tasks_.load() || flight_.landed()) return true;
          return clients_.any_submitted();
        },
        deadline, polling);
  }
}

bool Worker::drain_rings() {
  bool consumed = false;
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    if (!clients_.joined(c)) continue;
    SubmitEntry entry;
    // At most one ring's worth per client per pass, so a client that keeps refilling its ring
    // cannot keep the worker from its deadlines, its other clients or a stop request.
    for (uint32_t popped = 0; popped < SubmitRing::capacity && !failed_.load(); ++popped) {
      const PopResult result = clients_.pop(c, &entry);
      if (result == PopResult::kEmpty) break;
      if (result == PopResult::kCorrupt) {
        fail(Status::protocol("job " + options_.job_id + ": " + who(c) + " corrupted its submission ring"));
        return consumed;
      }
      consumed = true;
      Status status = handle_entry(c, entry);
      if (!status.ok()) {
        fail(status);
        return consumed;
      }
    }
  }
  return consumed;
}

Status Worker::handle_entry(uint32_t local_rank, const SubmitEntry& entry) {
  switch (static_cast<SubmitKind>(entry.kind)) {
    case SubmitKind::kOp: return handle_submit(local_rank, entry);
    case SubmitKind::kMarkReady: return ops_.mark_ready(local_rank, entry.op_seq, entry.tensor_index);
  }
  return Status::protocol("job " + options_.job_id + ": " + who(local_rank) + " sent an unknown ring entry kind " +
                          std::to_string(entry.kind));
}

Status Worker::handle_submit(uint32_t local_rank, const SubmitEntry& entry) {
  const std::string prefix = "job " + options_.job_id + ": " + who(local_rank) + ": operation " +
                             std::to_string(entry.op_seq) + ": ";
  const auto prefixed = [&](const Status& status) {
    return Status(status.code(), prefix + status.message(), status.where());
  };
  uint64_t& next_seq = clients_.next_seq(local_rank);
  if (entry.op_seq != next_seq) {
    return Status::protocol(prefix + "out of sequence, expected operation " + std::to_string(next_seq));
  }
  if (!ops_.within_window(entry.op_seq)) {
    return Status::protocol(prefix + "more than " + std::to_string(CompletionRing::capacity) +
                            " operations ahead of the job");
  }
  OpDesc desc;
  if (Status status = parse_op(entry, options_.topology.world_size, &desc); !status.ok()) return prefixed(status);
  std::shared_ptr<const TensorSet> set = find_set(desc.set_id);
  if (!set) {
    if (was_retired(desc.set_id)) {
      return Status::invalid_argument(prefix + "set " + std::to_string(desc.set_id) +
                                      " was released by every local rank");
    }
    return Status::invalid_argument(prefix + "set " + std::to_string(desc.set_id) +
                                    " is not registered (register tensors before submitting operations)");
  }
  if (Status status = check_op(desc, *set, options_.topology); !status.ok()) return prefixed(status);
  next_seq++;
  Status status = ops_.submit(local_rank, entry.op_seq, (entry.flags & kSubmitAllReady) != 0, desc, std::move(set));
  pending_ops_.store(ops_.size());
  return status;
}

Status Worker::progress() {
  Status status = progress_ops();
  if (ops_.empty()) {
    current_seq_.store(0, std::memory_order_relaxed);
    current_bucket_.store(0, std::memory_order_relaxed);
  } else {
    current_seq_.store(ops_.front().seq, std::memory_order_relaxed);
    current_bucket_.store(static_cast<uint32_t>(ops_.front().next_bucket), std::memory_order_relaxed);
  }
  executing_.store(flight_.active(), std::memory_order_relaxed);
  return status;
}

Worker::Position Worker::position() const {
  Position p;
  p.operations_done = completed_ops_.load();
  p.current_seq = current_seq_.load(std::memory_order_relaxed);
  p.current_bucket = current_bucket_.load(std::memory_order_relaxed);
  p.executing = executing_.load(std::memory_order_relaxed);
  return p;
}

std::vector<std::string> Worker::node_addresses() const {
  MutexLock lock(mutex_);
  return node_addresses_;
}

Status Worker::progress_ops() {
  while (!ops_.empty()) {
    Op& op = ops_.front();
    if (flight_.active()) {
      if (!flight_.landed()) return Status::ok_status();  // still executing
      if (Status status = land(op); !status.ok()) return status;
    }
    if (!op.begun && !begin(op)) {
      // Held for a settings change, which the watcher bounds: the job timeout runs from the
      // release, not from before the hold.
      op.waiting_since = std::chrono::steady_clock::now();
      return Status::ok_status();
    }
    if (!ops_.head_ready()) return Status::ok_status();
    if (op.next_bucket < op.set->plan.buckets.size()) {
      if (Status status = launch(op); !status.ok()) return status;
      continue;  // a node-local bucket has landed already
    }
    complete(op);
  }
  return Status::ok_status();
}

std::vector<reduce::Health> Worker::fold_health(const Op& op) const {
  // Each local rank's: the blocks of the tensors of its groups (the others were not reduced
  // for it), in block order (reduce/health.h), so every rank of a group gets the same bits on
  // every node and in every run.
  const TensorSet& set = *op.set;
  std::vector<reduce::Health> health(clients_.size());
  std::map<std::string, std::vector<bool>> members;  // group -> [local rank] is a member
  for (size_t t = 0; t < set.layout.size(); ++t) {
    auto [it, added] = members.try_emplace(set.layout[t].group);
    if (added) {
      it->second.assign(clients_.size(), false);
      for (int local : options_.topology.local_members(set.layout[t].group)) it->second[static_cast<size_t>(local)] = true;
    }
    const uint64_t first = set.health_block[t];
    const uint64_t end = t + 1 < set.layout.size() ? set.health_block[t + 1] : set.health_blocks;
    for (uint32_t c = 0; c < clients_.size(); ++c) {
      if (!it->second[c]) continue;
      for (uint64_t b = first; b < end; ++b) {
        health[c].sum_sq = health[c].sum_sq + (*op.health)[b].sum_sq;
        health[c].found_inf = health[c].found_inf || (*op.health)[b].nonfinite != 0;
      }
    }
  }
  return health;
}

void Worker::complete(Op& op) {
  // The books first, the clients last: a client may leave the moment it reads its completion,
  // and the io thread then asks pending_ops() whether the job ended between operations (clean)
  // or with work in flight (failed). Counted the other way round, a job whose last rank exits
  // at once was sometimes reported failed, with a warning, after every operation had finished.
  const std::vector<reduce::Health> health = op.health ? fold_health(op) : std::vector<reduce::Health>{};
  const uint64_t seq = op.seq;
  const auto finished = std::chrono::steady_clock::now();
  stats_->operation_done(finished - op.started);
  trace_->add(OpTrace{op.seq, describe(op.desc, op.set.get()), op.desc.set_id, op.started, finished,
                      std::move(op.traced), op.traced_left_out});
  const std::shared_ptr<const TensorSet> set = awaiting_retire_.empty() ? nullptr : op.set;
  ops_.pop_front();  // `op` is gone from here on
  pending_ops_.store(ops_.size());
  completed_ops_.fetch_add(1);
  for (uint32_t c = 0; c < clients_.size(); ++c) post(c, seq, Status::ok_status(), health.empty() ? nullptr : &health[c]);
  if (set && awaiting_retire_.count(set->id)) retire_in_executor(*set);  // perhaps a released set's last operation
}

BucketExecutor* Worker::executor_for(MemoryKind kind, Status* status) {
  MutexLock lock(mutex_);
  auto it = executors_.find(kind);
  if (it != executors_.end()) return it->second.get();
  std::unique_ptr<BucketExecutor> made;
  ExecutorContext context{options_.pool, options_.log, [this](const Status& why) { fail(why); }, options_.integrity};
  *status = options_.backends->make_executor(kind, context, &made);
  if (!status->ok()) return nullptr;
  // A failure recorded before the executor existed still reaches it.
  if (!failure_.ok()) made->abort(failure_);
  return executors_.emplace(kind, std::move(made)).first->second.get();
}

Status Worker::launch(Op& op) {
  const TensorSet& set = *op.set;
  const size_t bucket = op.next_bucket;
  const plan::Bucket& b = set.plan.buckets[bucket];
  if (set.participants[bucket].empty()) {  // the group has no rank on this node
    op.next_bucket++;
    return Status::ok_status();
  }
  BucketCall call;
  call.seq = op.seq;
  call.desc = op.desc;
  call.set = op.set;
  call.bucket = bucket;
  call.topology = &options_.topology;
  call.args = kernel_args(op.desc, b.dtype, static_cast<int>(options_.topology.ranks(b.group).size()));
  if (options_.cluster && set.memory_kind == MemoryKind::kHostMemfd) {
    if (Status status = options_.cluster->engine(b.group, &call.engine); !status.ok()) return status;
  }
  Status status;
  BucketExecutor* executor = executor_for(set.memory_kind, &status);
  if (!executor) return status;
  // Cross-node, whatever the engine: a device bucket's NCCL spans the group's nodes too, so its
  // errors are explained by the cluster and its bound allows for waiting on peers.
  const bool cross_node = options_.cluster && options_.topology.nodes_of(b.group).size() > 1;
  const auto now = std::chrono::steady_clock::now();
  stats_->bucket_launched(static_cast<uint32_t>(bucket), now - op.waiting_since);
  BucketDone done = flight_.start(BucketFlight::Launch{op.seq, bucket, b.group, cross_node, now});
  call.timings = flight_.timings();
  call.health = op.health;
  try {
    executor->launch(std::move(call), done);  // a copy: should launch() throw, this one answers
  } catch (...) {
    // The executor threw instead of answering (memory ran out): the bucket failed, and the job
    // with it. Answering the flight here lets the shutdown that follows wait for it as for any
    // other; whatever the executor queued before it threw, its abort ends.
    const Status failed = Status::internal("job " + options_.job_id + ": the job's worker failed launching bucket " +
                                           std::to_string(bucket) + " of operation " + std::to_string(op.seq) + ": " +
                                           current_exception_text());
    done(failed);
    return failed;
  }
  return Status::ok_status();
}

Status Worker::land(Op& op) {
  const BucketFlight::Launch flight = flight_.current();
  Status answer = flight_.take();
  if (!answer.ok()) {
    // Name the bucket, and let the cluster lead with the node at fault.
    const ErrorCode code = answer.code();
    if (flight.cross_node && options_.cluster && code != ErrorCode::kLayoutMismatch &&
        code != ErrorCode::kNotSupported) {
      answer = options_.cluster->explain(answer);
    }
    return answer;
  }
  op.waiting_since = std::chrono::steady_clock::now();
  const plan::Bucket& bucket = op.set->plan.buckets[op.next_bucket];
  const BucketTimings& timings = *flight_.timings();
  stats_->bucket_landed(static_cast<uint32_t>(op.next_bucket), bucket.bytes, op.waiting_since - flight.launched,
                        timings);
  trace_landed(op, clients_.size(), flight.launched, op.waiting_since, timings);
  op.next_bucket++;
  return Status::ok_status();
}

std::chrono::steady_clock::time_point Worker::execution_deadline() const {
  // A bucket across nodes first waits for the other nodes to reach it (the sequence check),
  // which the job timeout bounds; the execution bound starts after that allowance.
  const BucketFlight::Launch& flight = flight_.current();
  return flight.launched + options_.execution_timeout +
         (flight.cross_node ? options_.timeout : std::chrono::milliseconds{});
}

Status Worker::check_deadline() {
  if (ops_.empty()) return Status::ok_status();
  const Op& op = ops_.front();
  const auto now = std::chrono::steady_clock::now();
  if (flight_.active()) {
    if (now < execution_deadline()) return Status::ok_status();
    return flight_.overran("job " + options_.job_id, describe(op.desc, op.set.get()), options_.execution_timeout,
                           options_.timeout);
  }
  if (now - op.waiting_since < options_.timeout) return Status::ok_status();
  return ops_.head_timed_out(options_.timeout);
}

void Worker::post(uint32_t local_rank, uint64_t seq, const Status& status, const reduce::Health* health) {
  if (!clients_.post(local_rank, seq, status, health)) {
    fail(Status::protocol("job " + options_.job_id + ": " + who(local_rank) + " does not drain its completion ring"));
  }
}

void Worker::shut_down(const Status& failure) {
  // The bucket in flight may still write the clients' tensors (a fan-out, a Gloo call in its
  // grace period): nobody is told the step failed, and so free to reuse the memory, until it
  // is back. The aborts bound this wait to about a second.
  flight_.wait(options_.log);
  const Status status = drain_executors(failure);
  // The job learns of the failure first (posted to the io thread), before any client can: a
  // client told of it may exit at once, and its disconnect, reaching the io thread before a
  // report made after the teardown below (which may block for a second), would be taken for
  // the cause and logged as such.
  stopped_told_ = true;
  if (options_.on_stopped) options_.on_stopped(status);
  // Publish the sticky error first so that clients fail later submissions without waiting.
  clients_.publish_failure(status);
  for (const Op& op : ops_) {
    for (uint32_t c = 0; c < clients_.size(); ++c) {
      if (op.submitted[c]) post(c, op.seq, status);
    }
  }
  const bool interrupted = !ops_.empty();
  ops_.clear();
  {
    // Now that the clients know, the executors go, and before the sets: NCCL may hold
    // registrations of the sets' memory, which must end before the memory is unmapped. Their
    // teardown may block (a communicator's end, a Gloo thread), which is why it comes after
    // the clients were told.
    std::map<MemoryKind, std::unique_ptr<BucketExecutor>> executors;
    {
      MutexLock lock(mutex_);
      executors.swap(executors_);
    }
    executors.clear();  // outside the lock: a destructor may wait for its thread
  }
  {
    // Nothing will execute any more: release the client mappings now, not when the job ends.
    MutexLock lock(mutex_);
    sets_.clear();
  }
  pending_ops_.store(0);
  clients_.wake_all();
  if (interrupted) options_.log.warning("per-step path stopped with operations pending: " + status.to_string());
  run_tasks(/*last=*/true);  // pending set admissions learn the failure
  settings_.stop(status);
  replans_.clear();  // re-planned copies hold the clients' mappings too
  release_cluster(status);
}

Status Worker::drain_executors(const Status& failure) {
  // A device executor answers buckets once they are queued on the GPU: drain that work before
  // the clients learn of the failure and free or reuse their buffers, within the job timeout.
  const auto drain_by = std::chrono::steady_clock::now() + options_.timeout;
  std::vector<BucketExecutor*> executors;
  {
    MutexLock lock(mutex_);
    for (auto& [kind, executor] : executors_) executors.push_back(executor.get());
  }
  bool drained = true;  // only this thread removes executors, so the pointers stay valid
  for (BucketExecutor* executor : executors) drained = executor->quiesce(drain_by) && drained;
  if (drained) return failure;
  // GPU work may still read or write the clients' memory (it waits on a ready event that will
  // never fire). Unmapping it would fault the GPU context every job on it shares, so the job's
  // sets, and with them every mapping, go to the backends, which keep them until the daemon
  // exits: the registered sets, and the released device sets something still holds.
  size_t kept = 0;
  {
    MutexLock lock(mutex_);
    for (auto& [id, set] : sets_) options_.backends->keep_until_exit(set);
    kept = sets_.size();
    // Released device sets that queued GPU work still holds (or an operation in flight).
    for (const auto& weak : retired_device_sets_) {
      if (std::shared_ptr<const TensorSet> set = weak.lock()) {
        options_.backends->keep_until_exit(set);
        ++kept;
      }
    }
  }
  options_.log.error("GPU work of this job did not drain within the job timeout; its " + std::to_string(kept) +
                     " sets stay mapped until gradsyncd restarts");
  // The clients are told that GPU work may still touch their device buffers: they should not
  // reuse them.
  return Status(failure.code(), failure.message() + " (gradsyncd could not drain its GPU work for this job: "
                                                    "do not reuse the job's device buffers)");
}

void Worker::release_cluster(const Status& status) {
  if (!options_.cluster) return;
  const auto start = std::chrono::steady_clock::now();
  options_.cluster->publish_failure(status);
  options_.cluster->leave();
  {
    MutexLock lock(mutex_);
    cluster_released_ = true;
  }
  options_.cluster.reset();  // closes the Gloo meshes, so peers fail fast instead of timing out
  options_.log.debug("cluster state released in " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - start).count()) + " ms");
}

// ---- settings changes (SetConfig) ----

bool Worker::begin(Op& op) {
  std::vector<JobSettings> due;
  if (!settings_.begin(op.seq, &due)) return false;
  for (const JobSettings& change : due) {
    options_.log.info("from operation " + std::to_string(op.seq) + ": " + change.describe());
    active_.merge(change);
  }
  if (!due.empty()) {
    if (active_.timeout) options_.timeout = *active_.timeout;
    if (active_.execution_timeout) options_.execution_timeout = *active_.execution_timeout;
  }
  // Device sets keep the plan they were admitted with: their executor prepared per-bucket
  // state (NCCL registrations, staging) for it. Every node makes the same choice.
  if (active_.bucket_cap && op.set->memory_kind == MemoryKind::kHostMemfd && op.set->bucket_cap != *active_.bucket_cap) {
    // An operation's set is the one it was registered as: the re-planned copy is made from that.
    std::shared_ptr<const TensorSet> original = find_set(op.set->id);
    if (!original) original = op.set;
    rebind(op, replans_.get(original, *active_.bucket_cap, options_.topology), clients_.size());
  }
  if (op.desc.health) op.health = std::make_shared<std::vector<reduce::HealthBlock>>(op.set->health_blocks);
  op.begun = true;
  return true;
}

Status Worker::change_settings(const JobSettings& settings, std::chrono::milliseconds bound, uint64_t* from_seq) {
  if (Status failed = failure(); !failed.ok()) return failed;
  if (!options_.cluster) {
    *from_seq = settings_.schedule_here(settings);
    return Status();
  }
  return settings_.propose(settings, bound, from_seq);
}

}  // namespace gradsync
