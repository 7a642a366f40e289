#include "daemon/job/worker.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <set>


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

reduce::KernelArgs kernel_args(const OpDesc& desc, DType dtype, int group_size) {
  reduce::KernelArgs args;
  args.dtype = dtype;
  args.wide_accumulate = !desc.narrow_accumulate;
  switch (desc.reduce_op) {
    case WireReduceOp::kSum: args.combine = reduce::Combine::kSum; break;
    case WireReduceOp::kMin: args.combine = reduce::Combine::kMin; break;
    case WireReduceOp::kMax: args.combine = reduce::Combine::kMax; break;
    case WireReduceOp::kAvg:
      args.combine = reduce::Combine::kSum;
      args.scale = desc.scaling == WireScaling::kBefore ? reduce::Scale::kBefore : reduce::Scale::kAfter;
      args.divisor = desc.divisor != 0 ? desc.divisor : static_cast<double>(group_size);
      break;
  }
  return args;
}

}  // namespace

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)), clients_(static_cast<size_t>(options_.topology.local_world_size)) {
  agreement_bound_ = std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(60));
  thread_ = std::thread([this] { run(); });
  // A multi-node job meets its other nodes as soon as it exists, not at its first set: then a
  // node whose trainers are late is known to be there (and reported as slow, not gone).
  if (options_.cluster) {
    post_task([this](const Status& failed) {
      if (!failed.ok()) return;
      if (Status status = options_.cluster->form(); !status.ok()) return fail(status);
      std::shared_ptr<ConfigChannel> channel = options_.cluster->config_channel();
      std::lock_guard lock(mutex_);
      node_addresses_ = options_.cluster->node_addresses();
      if (channel) {
        config_channel_ = channel;
        config_watcher_ = std::thread([this, channel] { watch_config(channel); });
      }
    });
  }
}

Worker::~Worker() { stop(Status::aborted("job " + options_.job_id + " is shutting down")); }

void Worker::post_task(Task task) {
  {
    std::unique_lock lock(mutex_);
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
    std::vector<PendingOperation> out;
    if (!failed.ok()) return done(std::move(out));
    const auto now = std::chrono::steady_clock::now();
    const Topology& topology = options_.topology;
    for (const Op& op : ops_) {
      PendingOperation pending;
      pending.seq = op.seq;
      pending.kind = describe(op.desc, op.set.get());
      pending.set = op.desc.set_id;
      pending.age = std::chrono::duration_cast<std::chrono::milliseconds>(now - op.started);
      for (size_t c = 0; c < op.submitted.size(); ++c) {
        if (!op.submitted[c]) pending.ranks_not_submitted.push_back(topology.rank_of(static_cast<int>(c)));
      }
      if (op.set) {
        const auto& buckets = op.set->plan.buckets;
        // The head operation's bucket next_bucket is executing while flight_ is set (it
        // counts as done only once it lands).
        const bool executing = flight_ && &op == &ops_.front();
        for (size_t b = op.next_bucket; b < buckets.size(); ++b) {
          PendingBucket bucket;
          bucket.bucket = static_cast<uint32_t>(b);
          bucket.group = buckets[b].group;
          bucket.bytes = buckets[b].bytes;
          bucket.launched = executing && b == op.next_bucket;
          if (!bucket.launched) {
            for (uint32_t c : op.set->participants[b]) {
              const bool ready = c < op.submitted.size() && op.submitted[c] && b < op.remaining[c].size() &&
                                 op.remaining[c][b] == 0;
              if (!ready) bucket.ranks_not_ready.push_back(topology.rank_of(static_cast<int>(c)));
            }
          }
          pending.buckets.push_back(std::move(bucket));
        }
      }
      out.push_back(std::move(pending));
    }
    done(std::move(out));
  });
}

void Worker::run_tasks(bool last) {
  for (;;) {
    Task task;
    {
      std::lock_guard lock(mutex_);
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
    clients_[local_rank].emplace(channel);
  });
}

void Worker::admit_set(std::shared_ptr<const TensorSet> set, std::function<void(const Status&)> done) {
  post_task([this, set, done](const Status& failed) {
    if (!failed.ok()) return done(failed);
    Status status;
    if (options_.cluster) {
      status = options_.cluster->form();
      if (status.ok()) status = options_.cluster->check_layout(*set);
      // Every node forms the engines of a host set's groups in the same (sorted) order; device
      // sets get theirs from their executor, below.
      std::set<std::string> groups;
      if (set->memory_kind == MemoryKind::kHostMemfd) {
        for (const auto& bucket : set->plan.buckets) groups.insert(bucket.group);
      }
      for (const auto& group : groups) {
        CollectiveEngine* engine = nullptr;
        if (status.ok()) status = options_.cluster->engine(group, &engine);
      }
    }
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
      std::lock_guard lock(mutex_);
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

std::shared_ptr<const TensorSet> Worker::find_set(uint32_t id) {
  std::lock_guard lock(mutex_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

void Worker::fail(Status status) {
  {
    std::lock_guard lock(mutex_);
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
  std::lock_guard lock(mutex_);
  return failure_;
}

std::string Worker::who(uint32_t local_rank) const {
  return "rank " + std::to_string(options_.topology.rank_of(static_cast<int>(local_rank))) + " (local rank " +
         std::to_string(local_rank) + ")";
}

void Worker::run() {
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
    // Sleep until a client rings the doorbell, the executor answers, the bound of whatever the
    // worker is waiting for, or a slice. Shortly after work, poll a little first: a trainer
    // marking tensors ready one by one, or the next small step, then arrives without a futex
    // wake-up per entry; an idle worker does not poll at all.
    const Polling polling = now - last_work_ < kPollAfterWork ? kPollAfterWorkFor : Polling{};
    auto deadline = now + kWakeSlice;
    if (flight_) {
      deadline = std::min(deadline, execution_deadline());
    } else if (!ops_.empty()) {
      deadline = std::min(deadline, ops_.front().waiting_since + options_.timeout);
    }
    doorbell().wait_until(
        [&] {
          if (failed_.load() || has_tasks_.load() || has_landed_.load()) return true;
          for (const auto& client : clients_) {
            if (client && !client->submit.empty()) return true;
          }
          return false;
        },
        deadline, polling);
  }
  shut_down(failure());
}

bool Worker::drain_rings() {
  bool consumed = false;
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    if (!clients_[c]) continue;
    SubmitEntry entry;
    // At most one ring's worth per client per pass, so a client that keeps refilling its ring
    // cannot keep the worker from its deadlines, its other clients or a stop request.
    for (uint32_t popped = 0; popped < SubmitRing::capacity && !failed_.load(); ++popped) {
      const PopResult result = clients_[c]->submit.try_pop(&entry);
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
    case SubmitKind::kMarkReady: return handle_mark_ready(local_rank, entry);
  }
  return Status::protocol("job " + options_.job_id + ": " + who(local_rank) + " sent an unknown ring entry kind " +
                          std::to_string(entry.kind));
}

Status Worker::handle_submit(uint32_t local_rank, const SubmitEntry& entry) {
  const std::string prefix = "job " + options_.job_id + ": " + who(local_rank) + ": operation " +
                             std::to_string(entry.op_seq) + ": ";
  ClientState& client = *clients_[local_rank];
  if (entry.op_seq != client.next_seq) {
    return Status::protocol(prefix + "out of sequence, expected operation " + std::to_string(client.next_seq));
  }
  // The client library keeps at most CompletionRing::capacity operations outstanding; a client
  // that runs further ahead of the job is broken, and would otherwise grow ops_ without bound.
  if (entry.op_seq - first_seq_ >= CompletionRing::capacity) {
    return Status::protocol(prefix + "more than " + std::to_string(CompletionRing::capacity) +
                            " operations ahead of the job");
  }
  OpDesc desc;
  if (Status status = parse_op(entry, options_.topology.world_size, &desc); !status.ok()) {
    return Status(status.code(), prefix + status.message(), status.where());
  }
  std::shared_ptr<const TensorSet> set = find_set(desc.set_id);
  if (!set) {
    return Status::invalid_argument(prefix + "set " + std::to_string(desc.set_id) +
                                    " is not registered (register tensors before submitting operations)");
  }
  if (desc.kind == OpKind::kAllgather && set->gather_output.empty()) {
    return Status::invalid_argument(prefix + set->name() + " was registered without an allgather output");
  }
  if (desc.kind == OpKind::kAllreduce || desc.kind == OpKind::kReduce) {
    for (const auto& bucket : set->plan.buckets) {
      const int group_size = static_cast<int>(options_.topology.ranks(bucket.group).size());
      const std::string_view problem = reduce::validate_kernel_args(kernel_args(desc, bucket.dtype, group_size));
      if (!problem.empty()) return Status::invalid_argument(prefix + std::string(problem));
    }
  }
  if (Status status = check_roots(desc, *set); !status.ok()) {
    return Status(status.code(), prefix + status.message(), status.where());
  }
  client.next_seq++;

  const uint64_t index = entry.op_seq - first_seq_;
  if (index == ops_.size()) {
    Op op;
    op.seq = entry.op_seq;
    op.desc = desc;
    op.set = set;
    op.started = std::chrono::steady_clock::now();
    op.waiting_since = op.started;
    const size_t clients = clients_.size();
    const size_t buckets = set->plan.buckets.size();
    op.submitted.assign(clients, false);
    op.marked.assign(clients, {});
    op.remaining.assign(clients, {});
    op.clients_ready.assign(buckets, 0);
    op.first_ready.assign(buckets, {});
    op.ready_at.assign(buckets * clients, {});
    ops_.push_back(std::move(op));
    pending_ops_.store(ops_.size());
  }
  Op& op = ops_[index];
  if (!(op.desc == desc)) {
    uint32_t first = 0;
    while (first < op.submitted.size() && !op.submitted[first]) ++first;
    return Status::layout_mismatch("job " + options_.job_id + ": operation " + std::to_string(op.seq) +
                                   " differs: " + who(first) + " submitted " + describe(op.desc, op.set.get()) + ", " +
                                   who(local_rank) + " submitted " +
                                   describe(desc, set.get()));
  }
  op.submitted[local_rank] = true;
  const auto& buckets = op.set->plan.buckets;
  if (entry.flags & kSubmitAllReady) {
    op.remaining[local_rank].assign(buckets.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) note_ready(op, b, local_rank);
  } else {
    op.marked[local_rank].assign(op.set->layout.size(), false);
    op.remaining[local_rank].resize(buckets.size());
    for (size_t b = 0; b < buckets.size(); ++b) {
      op.remaining[local_rank][b] = static_cast<uint32_t>(buckets[b].tensors.size());
      if (buckets[b].tensors.empty()) note_ready(op, b, local_rank);
    }
  }
  return Status::ok_status();
}

Status Worker::handle_mark_ready(uint32_t local_rank, const SubmitEntry& entry) {
  // Built only for an error: this runs once per tensor per step.
  const auto prefix = [&] { return "job " + options_.job_id + ": " + who(local_rank) + ": "; };
  if (entry.op_seq < first_seq_ || entry.op_seq - first_seq_ >= ops_.size()) {
    return Status::protocol(prefix() + "marked a tensor ready for operation " + std::to_string(entry.op_seq) +
                            ", which is not pending");
  }
  Op& op = ops_[entry.op_seq - first_seq_];
  if (!op.submitted[local_rank] || op.marked[local_rank].empty()) {
    return Status::protocol(prefix() + "marked a tensor ready for operation " + std::to_string(entry.op_seq) +
                            ", which it did not submit with deferred readiness");
  }
  if (entry.tensor_index >= op.set->layout.size()) {
    return Status::invalid_argument(prefix() + "tensor index " + std::to_string(entry.tensor_index) +
                                    " is out of range; " + op.set->name() + " has " +
                                    std::to_string(op.set->layout.size()) + " tensors");
  }
  if (op.marked[local_rank][entry.tensor_index]) {
    return Status::invalid_argument(prefix() + "tensor " + std::to_string(entry.tensor_index) +
                                    " was marked ready twice in operation " + std::to_string(entry.op_seq));
  }
  op.marked[local_rank][entry.tensor_index] = true;
  const uint32_t bucket = op.set->plan.bucket_of_tensor[entry.tensor_index];
  if (--op.remaining[local_rank][bucket] == 0) note_ready(op, bucket, local_rank);
  return Status::ok_status();
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
  executing_.store(flight_.has_value(), std::memory_order_relaxed);
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
  std::lock_guard lock(mutex_);
  return node_addresses_;
}

Status Worker::progress_ops() {
  while (!ops_.empty()) {
    Op& op = ops_.front();
    if (flight_) {
      if (!has_landed_.load()) return Status::ok_status();  // still executing
      if (Status status = land(op); !status.ok()) return status;
    }
    if (!op.begun && !begin(op)) {
      // Held for a settings change, which the watcher bounds: the job timeout runs from the
      // release, not from before the hold.
      op.waiting_since = std::chrono::steady_clock::now();
      return Status::ok_status();
    }
    const size_t buckets = op.set->plan.buckets.size();
    if (op.next_bucket < buckets) {
      if (op.clients_ready[op.next_bucket] != clients_.size()) return Status::ok_status();
      if (Status status = launch(op); !status.ok()) return status;
      continue;  // a node-local bucket has landed already
    }
    // A set with no buckets still needs every client's submission before it completes.
    if (std::find(op.submitted.begin(), op.submitted.end(), false) != op.submitted.end()) return Status::ok_status();
    for (uint32_t c = 0; c < clients_.size(); ++c) post(c, op.seq, Status::ok_status());
    const auto finished = std::chrono::steady_clock::now();
    stats_->operation_done(finished - op.started);
    trace_->add(OpTrace{op.seq, describe(op.desc, op.set.get()), op.desc.set_id, op.started, finished, std::move(op.traced),
                        op.traced_left_out});
    ops_.pop_front();
    pending_ops_.store(ops_.size());
    first_seq_++;
    completed_ops_.fetch_add(1);
    if (!ops_.empty()) ops_.front().waiting_since = std::chrono::steady_clock::now();
  }
  return Status::ok_status();
}

BucketExecutor* Worker::executor_for(MemoryKind kind, Status* status) {
  std::lock_guard lock(mutex_);
  auto it = executors_.find(kind);
  if (it != executors_.end()) return it->second.get();
  std::unique_ptr<BucketExecutor> made;
  ExecutorContext context{options_.pool, options_.log, [this](const Status& why) { fail(why); }};
  *status = options_.backends->make_executor(kind, context, &made);
  if (!status->ok()) return nullptr;
  // A failure recorded before the executor existed still reaches it.
  if (!failure_.ok()) made->abort(failure_);
  return executors_.emplace(kind, std::move(made)).first->second.get();
}

void Worker::note_ready(Op& op, size_t bucket, uint32_t local_rank) {
  op.clients_ready[bucket]++;
  const auto now = std::chrono::steady_clock::now();
  if (op.first_ready[bucket] == std::chrono::steady_clock::time_point{}) op.first_ready[bucket] = now;
  op.ready_at[bucket * clients_.size() + local_rank] = now;
  stats_->bucket_ready(static_cast<int>(local_rank), now - op.first_ready[bucket]);
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
  stats_->bucket_launched(static_cast<uint32_t>(bucket), std::chrono::steady_clock::now() - op.waiting_since);
  flight_ = Flight{op.seq, bucket, b.group, cross_node, std::chrono::steady_clock::now()};
  *timings_ = BucketTimings{};
  call.timings = timings_;
  // The answer may come on any thread. Once has_landed_ is set the worker may finish and be
  // destroyed, so nothing of `this` is touched after the lock is released: the notify happens
  // under it, and land() and wait_for_flight() take the lock before going on.
  executor->launch(std::move(call), [this, doorbell = options_.doorbell](const Status& answer) {
    std::lock_guard lock(landed_mutex_);
    landed_ = answer;
    has_landed_.store(true);
    doorbell->page()->doorbell.notify();
  });
  return Status::ok_status();
}

Status Worker::land(Op& op) {
  Status answer;
  {
    std::lock_guard lock(landed_mutex_);
    answer = std::move(*landed_);
    landed_.reset();
    has_landed_.store(false);
  }
  const Flight flight = *flight_;
  flight_.reset();
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
  stats_->bucket_landed(static_cast<uint32_t>(op.next_bucket), bucket.bytes, op.waiting_since - flight.launched,
                        *timings_);
  if (op.traced.size() < TraceLog::kMaxBuckets) {
    BucketTrace traced;
    traced.index = static_cast<uint32_t>(op.next_bucket);
    traced.group = bucket.group;
    traced.bytes = bucket.bytes;
    const auto first = op.ready_at.begin() + static_cast<std::ptrdiff_t>(op.next_bucket * clients_.size());
    traced.ready.assign(first, first + static_cast<std::ptrdiff_t>(clients_.size()));
    traced.launched = flight.launched;
    traced.landed = op.waiting_since;
    traced.parts = *timings_;
    op.traced.push_back(std::move(traced));
  } else {
    op.traced_left_out++;
  }
  op.next_bucket++;
  return Status::ok_status();
}

std::chrono::steady_clock::time_point Worker::execution_deadline() const {
  // A bucket across nodes first waits for the other nodes to reach it (the sequence check),
  // which the job timeout bounds; the execution bound starts after that allowance.
  return flight_->launched + options_.execution_timeout + (flight_->cross_node ? options_.timeout : decltype(options_.timeout){});
}

void Worker::wait_for_flight() {
  if (!flight_) return;
  // The executor and the engines were aborted when the job failed, so the answer comes within
  // about a second; until then the bucket may still touch memory the call holds.
  const auto start = std::chrono::steady_clock::now();
  auto next_note = start + std::chrono::seconds(2);
  while (!has_landed_.load()) {
    doorbell().wait_until([&] { return has_landed_.load(); }, std::chrono::steady_clock::now() + kWakeSlice);
    if (!has_landed_.load() && std::chrono::steady_clock::now() >= next_note) {
      options_.log.warning("still waiting for bucket " + std::to_string(flight_->bucket) + " of operation " +
                           std::to_string(flight_->seq) + " to come back from its executor after the abort");
      next_note += std::chrono::seconds(2);
    }
  }
  std::lock_guard lock(landed_mutex_);
  landed_.reset();
  has_landed_.store(false);
  flight_.reset();
}

Status Worker::check_roots(const OpDesc& desc, const TensorSet& set) const {
  if (desc.kind != OpKind::kBroadcast && desc.kind != OpKind::kReduce) return Status();
  for (const auto& bucket : set.plan.buckets) {
    const auto& ranks = options_.topology.ranks(bucket.group);
    if (!std::binary_search(ranks.begin(), ranks.end(), desc.root)) {
      return Status::invalid_argument("root rank " + std::to_string(desc.root) + " is not in group '" + bucket.group +
                                      "'");
    }
  }
  return Status();
}

Status Worker::check_deadline() {
  if (ops_.empty()) return Status::ok_status();
  const Op& op = ops_.front();
  const auto now = std::chrono::steady_clock::now();
  auto ms = [](auto d) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
  if (flight_) {
    if (now < execution_deadline()) return Status::ok_status();
    return Status::timeout(
        "job " + options_.job_id + ": bucket " + std::to_string(flight_->bucket) + " of operation " +
        std::to_string(op.seq) + " (" + describe(op.desc, op.set.get()) + ", group '" + flight_->group + "') has executed for " +
        ms(now - flight_->launched) + " ms, over the execution bound of " +
        std::to_string(options_.execution_timeout.count()) + " ms (gradsyncd --execution-timeout-ms)" +
        (flight_->cross_node ? " plus the job timeout of " + std::to_string(options_.timeout.count()) +
                                   " ms for the other nodes to reach it; the collective across nodes is stuck"
                             : ""));
  }
  if (now - op.waiting_since < options_.timeout) return Status::ok_status();
  std::string missing;
  for (uint32_t c = 0; c < clients_.size(); ++c) {
    const bool late = !op.submitted[c] || (op.next_bucket < op.remaining[c].size() &&
                                            op.remaining[c][op.next_bucket] != 0);
    if (late) missing += (missing.empty() ? "" : ", ") + who(c);
  }
  return Status::timeout("job " + options_.job_id + ": operation " + std::to_string(op.seq) + " (" +
                         describe(op.desc, op.set.get()) + ") waited " + ms(now - op.waiting_since) + " ms, over the job timeout of " +
                         std::to_string(options_.timeout.count()) + " ms, for " +
                         (missing.empty() ? "its last submissions" : missing) +
                         (op.next_bucket < op.set->plan.buckets.size()
                              ? " to make bucket " + std::to_string(op.next_bucket) + " ready"
                              : " to submit it"));
}

void Worker::post(uint32_t local_rank, uint64_t seq, const Status& status) {
  CompletionEntry entry;
  entry.op_seq = seq;
  entry.code = static_cast<uint32_t>(status.code());
  const std::string& message = status.message();
  entry.message_length = static_cast<uint32_t>(std::min(message.size(), kCompletionMessageBytes));
  std::memcpy(entry.message, message.data(), entry.message_length);
  if (!clients_[local_rank]) return;  // never joined; nobody to tell
  ClientState& client = *clients_[local_rank];
  // A client keeps at most CompletionRing::capacity operations outstanding, so a full ring means
  // it stopped draining; the job cannot make progress without it.
  if (!client.completion.try_push(entry)) {
    fail(Status::protocol("job " + options_.job_id + ": " + who(local_rank) +
                          " does not drain its completion ring"));
    return;
  }
  client.completion_ready.notify();
}

void Worker::shut_down(const Status& failure) {
  // The bucket in flight may still write the clients' tensors (a fan-out, a Gloo call in its
  // grace period): nobody is told the step failed, and so free to reuse the memory, until it
  // is back. The aborts bound this wait to about a second.
  wait_for_flight();
  // A device executor answers buckets once they are queued on the GPU: drain that work before
  // the clients learn of the failure and free or reuse their buffers, within the job timeout.
  // Only this thread adds executors, so the map is read without the lock (which abort() from
  // other threads takes).
  const auto drain_by = std::chrono::steady_clock::now() + options_.timeout;
  bool drained = true;
  for (auto& [kind, executor] : executors_) drained = executor->quiesce(drain_by) && drained;
  if (!drained) {
    // GPU work may still read or write the clients' memory (it waits on a ready event that will
    // never fire). Unmapping it would fault the GPU context every job on it shares, so the
    // job's sets, and with them every mapping, are kept for the life of the daemon: leaked on
    // purpose, and logged.
    std::lock_guard lock(mutex_);
    auto* kept = new std::vector<std::shared_ptr<const TensorSet>>();
    for (auto& [id, set] : sets_) kept->push_back(set);
    options_.log.error("GPU work of this job did not drain within the job timeout; its " +
                       std::to_string(kept->size()) + " sets stay mapped until gradsyncd restarts");
  }
  // The clients are told, when the GPU work did not drain, that it may still touch their device
  // buffers: they should not reuse them.
  const Status status =
      drained ? failure
              : Status(failure.code(), failure.message() + " (gradsyncd could not drain its GPU work for this job: "
                                                           "do not reuse the job's device buffers)");
  // Publish the sticky error first so that clients fail later submissions without waiting.
  for (auto& client : clients_) {
    if (client) client->channel->publish_failure(status);
  }
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
    // the clients were told. (A lost executor frees nothing.)
    std::map<MemoryKind, std::unique_ptr<BucketExecutor>> executors;
    {
      std::lock_guard lock(mutex_);
      executors.swap(executors_);
    }
    executors.clear();  // outside the lock: a destructor may wait for its thread
  }
  {
    // Nothing will execute any more: release the client mappings now, not when the job ends.
    std::lock_guard lock(mutex_);
    sets_.clear();
  }
  pending_ops_.store(0);
  for (auto& client : clients_) {
    if (client) client->completion_ready.notify();
  }
  if (interrupted) options_.log.warning("per-step path stopped with operations pending: " + status.to_string());
  run_tasks(/*last=*/true);  // pending set admissions learn the failure
  stop_config_watcher(status);
  replanned_.clear();  // re-planned copies hold the clients' mappings too
  if (options_.on_stopped) options_.on_stopped(status);
  if (options_.cluster) {
    const auto start = std::chrono::steady_clock::now();
    options_.cluster->publish_failure(status);
    options_.cluster->leave();
    {
      std::lock_guard lock(mutex_);
      cluster_released_ = true;
    }
    options_.cluster.reset();  // closes the Gloo meshes, so peers fail fast instead of timing out
    options_.log.debug("cluster state released in " +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - start).count()) + " ms");
  }
}


// ---- settings changes (SetConfig) ----

bool Worker::begin(Op& op) {
  std::vector<JobSettings> due;
  {
    std::lock_guard lock(settings_mutex_);
    if (hold_) return false;
    while (!scheduled_.empty() && scheduled_.front().first <= op.seq) {
      due.push_back(std::move(scheduled_.front().second));
      scheduled_.pop_front();
    }
    begun_through_ = op.seq;
  }
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
    rebind(op, replanned(op.set, *active_.bucket_cap));
  }
  op.begun = true;
  return true;
}

std::shared_ptr<const TensorSet> Worker::replanned(const std::shared_ptr<const TensorSet>& set, uint64_t cap) {
  // An operation's set is the one it was registered as: the re-planned copy is made from that.
  std::shared_ptr<const TensorSet> original = find_set(set->id);
  if (!original) original = set;
  Replanned& cached = replanned_[set->id];
  if (cached.from != original || cached.cap != cap || !cached.set) {
    auto copy = std::make_shared<TensorSet>(*original);
    copy->bucket_cap = cap;
    complete_tensor_set(copy.get(), options_.topology);
    cached = Replanned{original, cap, std::move(copy)};
  }
  return cached.set;
}

void Worker::rebind(Op& op, std::shared_ptr<const TensorSet> set) {
  // Nothing of the operation has launched, so only its readiness moves to the new buckets:
  // a bucket is ready for a rank when each of its tensors is (every tensor, for a rank that
  // submitted with everything ready).
  op.set = std::move(set);
  const auto& plan = op.set->plan;
  const size_t buckets = plan.buckets.size();
  const size_t clients = clients_.size();
  const auto now = std::chrono::steady_clock::now();
  op.clients_ready.assign(buckets, 0);
  op.first_ready.assign(buckets, {});
  op.ready_at.assign(buckets * clients, {});
  for (size_t c = 0; c < clients; ++c) {
    if (!op.submitted[c]) continue;
    op.remaining[c].assign(buckets, 0);
    if (!op.marked[c].empty()) {
      for (size_t t = 0; t < op.marked[c].size(); ++t) {
        if (!op.marked[c][t]) op.remaining[c][plan.bucket_of_tensor[t]]++;
      }
    }
    for (size_t b = 0; b < buckets; ++b) {
      if (op.remaining[c][b] != 0) continue;
      op.clients_ready[b]++;
      if (op.first_ready[b] == std::chrono::steady_clock::time_point{}) op.first_ready[b] = now;
      op.ready_at[b * clients + c] = now;
    }
  }
}

Status Worker::change_settings(const JobSettings& settings, std::chrono::milliseconds bound, uint64_t* from_seq) {
  if (!options_.cluster) {
    if (Status failed = failure(); !failed.ok()) return failed;
    {
      std::lock_guard lock(settings_mutex_);
      *from_seq = begun_through_ + 1;
      scheduled_.emplace_back(*from_seq, settings);
    }
    return Status();
  }
  std::shared_ptr<ConfigChannel> channel;
  {
    std::lock_guard lock(mutex_);
    if (!failure_.ok()) return failure_;
    channel = config_channel_;
  }
  if (!channel) {
    return Status::not_supported("job " + options_.job_id +
                               " has not formed across its nodes yet; its settings can change once it has");
  }
  // One deadline for publishing and agreeing, so the caller's own bound holds.
  bound = std::min(bound, agreement_bound_);
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  uint64_t k = 0;
  if (Status s = channel->propose(settings.encode(), left(), &k); !s.ok()) {
    return Status(s.code(), "job " + options_.job_id + ": could not publish the change at the rendezvous: " + s.message());
  }
  if (Status s = channel->agree(k, left(), from_seq); !s.ok()) {
    return Status(s.code(), "job " + options_.job_id + ": the nodes did not all take change " + std::to_string(k) +
                                " within " + std::to_string(bound.count()) + " ms: " + s.message());
  }
  return Status();
}

void Worker::watch_config(std::shared_ptr<ConfigChannel> channel) {
  const auto bound = agreement_bound_;
  for (uint64_t k = 1;; ++k) {
    std::string text;
    bool claimed_before = false;  // k was claimed already at the previous wait's end
    for (;;) {
      const Status status = channel->wait(k, std::chrono::seconds(60), &text);
      if (status.ok()) break;
      if (channel->cancelled() || failed_.load()) return;  // the job ended
      if (status.code() == ErrorCode::kTimeout) {
        // A number claimed but never published would block every later change: one claimed a
        // whole wait ago and still unpublished is given up (its proposer died or was cut off).
        bool claimed = false;
        Status checked = channel->claimed(k, bound, &claimed);
        if (checked.ok() && claimed && claimed_before) checked = channel->give_up(k, bound);
        if (!checked.ok() && !channel->cancelled()) options_.log.warning("settings watcher: " + checked.message());
        claimed_before = checked.ok() && claimed;
        continue;
      }
      // The rendezvous may be briefly unreachable; the watcher must outlive that, or this
      // node would never offer for the next change and the job would fail then.
      options_.log.warning("settings watcher: cannot reach the rendezvous (" + status.message() + "); retrying");
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    JobSettings settings;
    if (text == ConfigChannel::kSkip) {
      options_.log.info("settings change " + std::to_string(k) + " was given up unpublished; skipped");
      continue;
    }
    if (!JobSettings::decode(text, &settings)) {
      // Every node reads the same value, so every node skips it alike.
      options_.log.warning("settings change " + std::to_string(k) + " at the rendezvous is malformed or out of "
                           "range; skipped");
      continue;
    }
    uint64_t hold = 0;
    {
      std::lock_guard lock(settings_mutex_);
      hold_ = true;
      hold = begun_through_ + 1;
    }
    uint64_t from = 0;
    Status status = channel->offer(k, hold, bound);
    if (status.ok()) status = channel->agree(k, bound, &from);
    if (!status.ok()) {
      if (channel->cancelled() || failed_.load()) return;
      // The other nodes may or may not apply it; going on with either settings could mix
      // buckets across nodes.
      fail(Status(status.code(), "job " + options_.job_id + ": the nodes did not agree on when settings change " +
                                     std::to_string(k) + " (" + settings.describe() + ") takes effect: " +
                                     status.message()));
      return;
    }
    {
      std::lock_guard lock(settings_mutex_);
      scheduled_.emplace_back(from, settings);
      hold_ = false;
    }
    doorbell().notify();
  }
}

void Worker::stop_config_watcher(const Status& why) {
  std::shared_ptr<ConfigChannel> channel;
  {
    std::lock_guard lock(mutex_);
    channel = config_channel_;
  }
  if (channel) channel->cancel(why);
  if (config_watcher_.joinable()) config_watcher_.join();
}

}  // namespace gradsync
