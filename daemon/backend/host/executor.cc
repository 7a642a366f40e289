#include "daemon/backend/host/executor.h"

#include "daemon/backend/host/local.h"
#include "daemon/backend/host/masked.h"

#include <new>

namespace gradsync::host {

HostExecutor::HostExecutor(ThreadPool* pool, Logger log, IntegrityCheck integrity)
    : pool_(pool), log_(std::move(log)), integrity_(integrity) {}

HostExecutor::~HostExecutor() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status HostExecutor::aborted() const {
  MutexLock lock(mutex_);
  return aborted_;
}

void HostExecutor::abort(const Status& why) {
  {
    MutexLock lock(mutex_);
    if (!aborted_.ok()) return;
    aborted_ = why.ok() ? Status::aborted("aborted") : why;
  }
  // A bucket on the cross-node thread is inside an engine call, which its owner aborts; local
  // work is finite and never waits on anything. So there is nothing more to interrupt here.
  wake_.notify_all();
}

void HostExecutor::launch(BucketCall call, BucketDone done) {
  if (Status status = aborted(); !status.ok()) return done(status);
  if (!call.engine) {
    {
      PhaseTimer timer(call.timings ? &call.timings->local : nullptr);
      run_local(call);
    }
    if (call.timings) call.timings->reported = true;
    return done(Status());
  }
  {
    MutexLock lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_.push_back(Queued{std::move(call), std::move(done)});
  }
  wake_.notify_all();
}

void HostExecutor::run_local(const BucketCall& call) {
  const TensorSet& set = *call.set;
  const Topology& topology = *call.topology;
  // The group lives on this node only, so the root (a member) is a local rank here.
  const uint32_t root = static_cast<uint32_t>(call.desc.root % topology.local_world_size);
  // A masked set's reductions combine only its kept elements (masked.h); broadcast and
  // allgather move every element.
  if (set.masked() && (call.desc.kind == OpKind::kAllreduce || call.desc.kind == OpKind::kReduce)) {
    const std::vector<uint32_t> root_only = {root};
    const bool allreduce = call.desc.kind == OpKind::kAllreduce;
    execute_masked(set, call.bucket, call.args, allreduce ? set.participants[call.bucket] : root_only, *pool_,
                   allreduce && call.health ? call.health->data() : nullptr);
    return;
  }
  switch (call.desc.kind) {
    case OpKind::kAllreduce:
      execute_allreduce(set, call.bucket, call.args, *pool_, call.health ? call.health->data() : nullptr);
      break;
    case OpKind::kReduce: execute_reduce(set, call.bucket, call.args, root, *pool_); break;
    case OpKind::kBroadcast: execute_broadcast(set, call.bucket, root, *pool_); break;
    case OpKind::kAllgather: execute_allgather(set, call.bucket, topology.rank_of(0), *pool_); break;
    case OpKind::kReduceScatter: execute_reduce_scatter(set, call.bucket, call.args, *pool_); break;
  }
}

namespace {

// What a cross-node step that threw says; call only inside a catch block.
std::string failed_step(const BucketCall& call) {
  return "the cross-node step of bucket " + std::to_string(call.bucket) + " of operation " + std::to_string(call.seq) +
         " failed: " + current_exception_text();
}

}  // namespace

void HostExecutor::run() {
  for (;;) {
    Queued next;
    Status status;
    {
      MutexLock lock(mutex_);
      while (!stopping_ && queue_.empty()) wake_.wait(lock);
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
      status = aborted_;
    }
    BucketTimings* timings = next.call.timings.get();
    try {
      if (status.ok()) {
        PhaseTimer timer(timings ? &timings->peers : nullptr);
        status = check_sequence(next.call, integrity_.every);
      }
      if (status.ok() && integrity_.fail_alloc_at_seq == next.call.seq) {
        const size_t tasks = pool_->size();
        pool_->parallel_for(tasks, [tasks](size_t i) {
          if (i + 1 == tasks) throw std::bad_alloc();  // a test hook (IntegrityCheck)
        });
      }
      if (status.ok()) status = execute_across_nodes(next.call, *pool_, buffers_, integrity_);
    } catch (const std::bad_alloc&) {
      // Memory ran out for the bucket's buffers (this thread's or a pool task's), or another
      // exception below: the bucket fails, and the job with it, not the daemon. An engine call it
      // started may still write the buffers it holds; the job's failure aborts the engine.
      status = Status::resource_exhausted(failed_step(next.call) + " (the daemon ran out of memory)");
    } catch (...) {
      status = Status::internal(failed_step(next.call));
    }
    if (timings) {
      timings->reported = true;
      timings->cross_node = true;
    }
    // An engine error after our own abort is the abort's doing, not a peer's.
    if (Status why = aborted(); !status.ok() && !why.ok()) status = why;
    next.done(status);
  }
}

}  // namespace gradsync::host
