// Fakes of the worker's seams, for unit tests that drive a real Worker without memory, threads
// of Gloo or other daemons: a HostCollectiveEngine whose behaviour the test picks (succeed, fail,
// hang until aborted, time out, take its time), a BucketExecutor that records what it was asked
// to run and either answers at once, holds the answer until the test releases it, or hands the
// bucket to the engine, a Cluster that hands out the fake engine, and a BackendFactory that
// makes the fake executor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/backend/executor.h"
#include "daemon/backend/factory.h"
#include "daemon/job/cluster.h"

namespace gradsync::testing {

class FakeEngine final : public HostCollectiveEngine {
 public:
  enum class Mode { kSucceed, kFail, kHangUntilAborted, kTimeOut, kTakeTime };

  FakeEngine(Mode mode, std::chrono::milliseconds delay = {}) : mode_(mode), delay_(delay) {}
  ~FakeEngine() override {
    abort(Status::aborted("fake engine closed"));
    for (auto& thread : threads_) thread.join();
  }

  int node() const override { return 0; }
  int nodes() const override { return 2; }

  void allreduce(void*, size_t, const ReduceSpec&, EngineDone done) override { run(std::move(done)); }
  void broadcast(void*, size_t, int, EngineDone done) override { run(std::move(done)); }
  void allgather(const void*, size_t, void*, EngineDone done) override { run(std::move(done)); }
  void reduce(void*, size_t, const ReduceSpec&, int, EngineDone done) override { run(std::move(done)); }
  void reduce_scatter(void*, std::span<const uint64_t>, const ReduceSpec&, EngineDone done) override {
    run(std::move(done));
  }

  void abort(const Status& why) override {
    EngineDone hung;
    {
      std::lock_guard lock(mutex_);
      if (!aborted_.ok()) return;
      aborted_ = why;
      hung = std::move(hung_);
    }
    if (hung) hung(why);
  }

  int calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
  }

 private:
  void run(EngineDone done) {
    std::unique_lock lock(mutex_);
    ++calls_;
    if (!aborted_.ok()) {
      const Status why = aborted_;
      lock.unlock();
      return done(why);
    }
    switch (mode_) {
      case Mode::kSucceed: lock.unlock(); return done(Status());
      case Mode::kFail: lock.unlock(); return done(Status::peer_lost("fake engine: connection to node 1 reset"));
      case Mode::kHangUntilAborted: hung_ = std::move(done); return;
      case Mode::kTimeOut:
      case Mode::kTakeTime:
        threads_.emplace_back([this, done = std::move(done)] {
          std::this_thread::sleep_for(delay_);
          done(mode_ == Mode::kTimeOut ? Status::timeout("fake engine: node 1 sent nothing for " +
                                                         std::to_string(delay_.count()) + " ms")
                                       : Status());
        });
        return;
    }
  }

  const Mode mode_;
  const std::chrono::milliseconds delay_;
  mutable std::mutex mutex_;
  Status aborted_;          // guarded by mutex_
  EngineDone hung_;         // guarded by mutex_
  int calls_ = 0;           // guarded by mutex_
  std::vector<std::thread> threads_;  // guarded by mutex_
};

// What the fake executor saw; shared with the test, which keeps it after the worker owns the
// executor.
struct ExecutorLog {
  enum class Mode { kAnswerAtOnce, kHold, kUseEngine, kThrowBadAlloc };

  std::mutex mutex;
  std::condition_variable changed;
  Mode mode = Mode::kAnswerAtOnce;
  std::vector<std::pair<uint64_t, size_t>> launched;  // (operation, bucket), in launch order
  std::deque<BucketDone> held;                        // kHold: answers the test has not released
  Status aborted;
  std::vector<std::string> admitted;  // "set <id> of job <job> over <n> nodes", in admission order
  Status admit_error;                 // what admit() answers
  bool drains = true;                 // what quiesce() answers
  std::vector<std::shared_ptr<const void>> kept;  // what the backends were asked to keep mapped
  std::vector<uint32_t> retired;      // the sets retire_set() let go of, in order
  int tidied = 0;                     // tidy() calls

  // Waits until `count` buckets were launched; false after `timeout`.
  bool wait_launched(size_t count, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return launched.size() >= count; });
  }

  // kHold: answers the oldest held bucket.
  void release(const Status& status = Status()) {
    BucketDone done;
    {
      std::lock_guard lock(mutex);
      if (held.empty()) return;
      done = std::move(held.front());
      held.pop_front();
    }
    done(status);
  }

  std::vector<std::pair<uint64_t, size_t>> snapshot() {
    std::lock_guard lock(mutex);
    return launched;
  }
};

class FakeExecutor final : public BucketExecutor {
 public:
  explicit FakeExecutor(std::shared_ptr<ExecutorLog> log) : log_(std::move(log)) {}

  Status admit(const TensorSet& set, const SetAdmission& admission) override {
    std::lock_guard lock(log_->mutex);
    log_->admitted.push_back("set " + std::to_string(set.id) + " of job " + admission.job + " over " +
                             std::to_string(admission.rendezvous->nodes()) + " nodes");
    return log_->admit_error;
  }

  void launch(BucketCall call, BucketDone done) override {
    std::unique_lock lock(log_->mutex);
    log_->launched.emplace_back(call.seq, call.bucket);
    log_->changed.notify_all();
    if (!log_->aborted.ok()) {
      const Status why = log_->aborted;
      lock.unlock();
      return done(why);
    }
    switch (log_->mode) {
      case ExecutorLog::Mode::kAnswerAtOnce: lock.unlock(); return done(Status());
      case ExecutorLog::Mode::kHold: log_->held.push_back(std::move(done)); return;
      case ExecutorLog::Mode::kUseEngine:
        lock.unlock();
        if (!call.engine) return done(Status::internal("fake executor: the bucket has no engine"));
        return call.engine->allreduce(nullptr, 0, ReduceSpec{}, std::move(done));
      case ExecutorLog::Mode::kThrowBadAlloc: lock.unlock(); throw std::bad_alloc();  // memory ran out
    }
  }

  void retire_set(uint32_t set_id) override {
    std::lock_guard lock(log_->mutex);
    log_->retired.push_back(set_id);
    log_->changed.notify_all();
  }
  void tidy() override {
    std::lock_guard lock(log_->mutex);
    ++log_->tidied;
    log_->changed.notify_all();
  }

  bool quiesce(std::chrono::steady_clock::time_point) override {
    std::lock_guard lock(log_->mutex);
    return log_->drains;
  }

  // As the contract asks: held buckets fail promptly with `why`.
  void abort(const Status& why) override {
    std::deque<BucketDone> held;
    {
      std::lock_guard lock(log_->mutex);
      if (!log_->aborted.ok()) return;
      log_->aborted = why;
      held.swap(log_->held);
    }
    for (auto& done : held) done(why);
  }

 private:
  std::shared_ptr<ExecutorLog> log_;
};

class FakeBackends final : public BackendFactory {
 public:
  explicit FakeBackends(std::shared_ptr<ExecutorLog> log) : log_(std::move(log)) {}

  Status import_memory(MemoryImport, std::shared_ptr<MemoryRegion>*) override {
    return Status::not_supported("fake backends import no memory");
  }
  Status create_events(int, std::shared_ptr<const ClientEvents>*) override {
    return Status::not_supported("fake backends make no events");
  }
  std::vector<std::string> memory_kinds() const override { return {"host memfd"}; }
  std::string devices() const override { return "fake"; }
  void keep_until_exit(std::shared_ptr<const void> memory) override {
    std::lock_guard lock(log_->mutex);
    log_->kept.push_back(std::move(memory));
  }
  bool keeps_undrained_memory() const override {
    std::lock_guard lock(log_->mutex);
    return !log_->kept.empty();
  }
  Status make_executor(MemoryKind, const ExecutorContext&, std::unique_ptr<BucketExecutor>* out) override {
    *out = std::make_unique<FakeExecutor>(log_);
    return Status();
  }

 private:
  std::shared_ptr<ExecutorLog> log_;
};

// Every group that spans nodes gets `engine`; explain() blames node 1, so tests can tell that
// the worker asked the cluster to explain an engine error.
class FakeCluster final : public Cluster {
 public:
  explicit FakeCluster(std::shared_ptr<FakeEngine> engine) : engine_(std::move(engine)) {}

  Status form() override { return Status(); }
  Status check_layout(const TensorSet&) override { return Status(); }
  Status engine(const std::string&, HostCollectiveEngine** engine) override {
    *engine = engine_.get();
    return Status();
  }
  Status explain(const Status& error) override {
    return Status(error.code(), "fake cluster: node 1 is to blame (" + error.message() + ")");
  }
  void abort(const Status& why) override { engine_->abort(why); }
  void publish_failure(const Status&) override {}
  int node() const override { return 0; }
  int nodes() const override { return 1; }
  Status exchange(const std::string&, const std::string& mine, std::vector<std::string>* all) override {
    *all = {mine};
    return Status();
  }

 private:
  std::shared_ptr<FakeEngine> engine_;
};

}  // namespace gradsync::testing
