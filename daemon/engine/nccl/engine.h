// The NCCL engine: one communicator per local GPU of a group, all ranks of one NCCL
// communicator that spans every GPU of the group on every node (DESIGN.md decision 6). This
// daemon drives its local GPUs' ranks from one thread inside ncclGroupStart/End, so NCCL does
// the NVLink and network hierarchy itself.
//
//   connect   ranks and the unique id agreed through the Rendezvous (store.h), then every
//             local rank created inside one group with ncclCommInitRankConfig in non-blocking
//             mode, and polled (every 10 ms, as PyTorch's NCCLUtils does) until ready, failed,
//             aborted, or past the timeout; any failure aborts them all.
//   calls     one group call per collective, then polled until NCCL has enqueued it (a
//             non-blocking group may stay in progress briefly); the work runs on the callers'
//             streams. avg is the caller's business (sum here, then the executor's fused
//             division): NCCL's ncclAvg is not bit-identical to the host path.
//   watchdog  watchdog.h: completion polls, asynchronous errors, deadlines; on any failure it
//             aborts every communicator once, then answers.
//   reuse     an engine that goes while its communicators are healthy and idle (every
//             collective issued on them finished) parks them (park.h) instead of aborting
//             them; the job's next generation takes them if every node kept the same ones.
//             abort() therefore aborts the communicators of this node alone only when work
//             may be in flight; those that span nodes it always aborts, so peers waiting in a
//             collective this node will not issue fail at once rather than at their timeout.
//   split     an engine whose spec names a parent (another engine of the same job holding all
//             of this node's GPUs of the group) splits its communicators off the parent's with
//             ncclCommSplit, sharing the parent's proxy, streams and buffers (splitShare): no
//             unique id, no bootstrap of its own. Every rank of the parent takes part (those
//             outside the child with NCCL_SPLIT_NOCOLOR), keyed by the child's planned rank, so
//             NCCL's ranks are the plan's. NCCL fills the child only when the parent leaves "in
//             progress", so the parent is polled first.
// Every NCCL call on this engine's communicators, ncclCommGetAsyncError and ncclCommAbort
// included, is made under the engine's own mutex (api.h); waits for "in progress" poll under it
// and sleep outside it. No lock is shared with another job's engine, so one job's abort never
// holds up another job's collectives. A split family (a parent and the engines split off it)
// shares one mutex: NCCL forbids calls on communicators that share resources from two threads
// at once, and one abort flag serves them all (an abort of one reaches the others' kernels), so
// a family's communicators are never kept for re-join: they are aborted with the engines.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "daemon/engine/device_engine.h"
#include "daemon/engine/nccl/api.h"
#include "daemon/engine/nccl/park.h"
#include "daemon/engine/nccl/store.h"
#include "daemon/engine/nccl/watchdog.h"
#include "shared/mutex.h"

namespace gradsync::nccl {

struct EngineTiming {
  std::chrono::milliseconds init_poll{10};
  std::chrono::milliseconds watchdog_poll{100};
  std::chrono::microseconds completion_poll{50};
  // How often a group call that NCCL left in progress is polled until it is enqueued.
  std::chrono::microseconds enqueue_poll{20};
};

class NcclEngine final : public DeviceCollectiveEngine, private WatchedComms {
 public:
  // `park`: where idle communicators are kept for the job's next generation; null: nowhere.
  NcclEngine(NcclApi* api, DeviceEngineSpec spec, EngineTiming timing = {}, CommPark* park = nullptr);
  ~NcclEngine() override;
  NcclEngine(const NcclEngine&) = delete;
  NcclEngine& operator=(const NcclEngine&) = delete;

  Status connect(Rendezvous* rendezvous) override;
  bool reused() const override { return reused_; }
  bool split() const override { return split_; }
  bool splittable() const override;
  int ranks() const override { return plan_.ranks; }
  std::span<const int> devices() const override { return spec_.devices; }
  int rank_of(int node, int local_rank) const override { return plan_.rank_of(node, local_rank); }

  Status allreduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& spec) override;
  Status broadcast(std::span<const DeviceBuffer> buffers, size_t bytes, int root) override;
  Status reduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& spec, int root) override;
  Status allgather(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t bytes) override;
  Status reduce_scatter(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t count,
                        const ReduceSpec& spec) override;
  Status register_buffer(int device, void* data, size_t bytes, bool* registered) override;
  Status deregister_buffer(int device, void* data) override;
  void watch(std::string what, std::function<Status(bool* done)> poll, std::chrono::milliseconds timeout,
             EngineDone done) override;
  void abort(const Status& why) override;
  void abandon() override;

 private:
  // WatchedComms, on the watchdog's thread.
  Status async_error() override;
  void abort_all() override;

  // Why calls must fail now (an abort, a failure); ok while healthy.
  Status unusable() const;
  // Polls every communicator until none is in progress: ok, the first failure, the abort, or a
  // timeout naming `what`. Takes the api's mutex for each poll, not between them.
  // `also_stop`: another engine's stop flag that ends the wait too (a split's child).
  Status wait_ready(const std::string& what, std::chrono::milliseconds timeout, std::chrono::microseconds poll,
                    const std::atomic<bool>* also_stop = nullptr);
  // Runs `issue(i)` for every local rank inside one group, then waits until NCCL enqueued it.
  Status group_call(const std::string& what, std::span<const DeviceBuffer> buffers,
                    const std::function<Status(size_t)>& issue);
  // Aborts every communicator (once); under the api's mutex.
  void abort_locked();
  // The communicator has ranks on other nodes.
  bool spans_nodes() const { return plan_.ranks > static_cast<int>(spec_.devices.size()); }
  // Nothing watched, and every collective issued on the communicators finished (answered ok).
  bool idle() const { return watching_.load() == 0 && completed_.load() == issued_.load(); }
  // connect(), between planning and the unique id: takes this node's kept communicators if
  // every node kept the same ones. *reused says whether it did.
  Status try_reuse(Rendezvous* rendezvous, bool* reused);
  // At the end: hands healthy, idle communicators to the park, ending their registrations.
  // False (nothing done) when they must be aborted instead. Under the api's mutex.
  bool park_locked();
  std::string park_key() const;
  std::string describe(size_t local) const;  // "GPU 3 (rank 5 of 8)"
  // connect() of a child: its communicators split off the parent's (spec_.parent), by the
  // deadline. On failure the parent is aborted first, then whatever NCCL made.
  Status split_from_parent(std::chrono::steady_clock::time_point deadline);
  // On the parent, for `child`: every local rank's ncclCommSplit inside one group once the
  // parent is not in progress, then polls the parent until NCCL made the child. *made gets one
  // entry per parent rank (null where the child has no GPU); it must outlive NCCL's writes.
  Status split_for(const NcclEngine& child, std::chrono::steady_clock::time_point deadline, std::vector<void*>* made);
  // The family's abort, for async_error() and the calls: ok unless a member was aborted.
  Status family_aborted_locked() const;

  NcclApi* api_;
  const DeviceEngineSpec spec_;
  const EngineTiming timing_;
  RankPlan plan_;                 // set by connect(), then read-only
  NcclEngine* parent_ = nullptr;  // spec_.parent, if it is an NcclEngine; used by connect() only
  // What the engines of one split family share (an engine alone is a family of one).
  struct Family {
    Mutex calls;      // every NCCL call on the family's communicators ("calls_" below)
    bool aborted = false;  // under calls: a member's communicators were aborted (NCCL's abort
                           // flag is shared: the others' work is cut short too)
  };
  std::shared_ptr<Family> family_;
  std::atomic<bool> in_family_{false};  // split off a parent, or a parent of a split
  CommPark* park_;                // may be null
  std::vector<void*> comms_;      // one per spec_.devices entry; set once by connect()
  UniqueId id_{};                 // what comms_ were made with; set by connect()
  bool reused_ = false;           // set by connect()
  bool split_ = false;            // set by connect(): split off spec_.parent
  std::atomic<bool> connected_{false};  // connect() succeeded
  // Collectives issued (counted before they are, by the issuing thread) and answered ok by the
  // watchdog (it answers in order, so this is the count up to the last answered).
  std::atomic<uint64_t> issued_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<int> watching_{0};  // watched, not answered yet
  bool comms_aborted_ = false;    // under calls_ (family_->calls): comms_ must not be used once set
  std::map<std::pair<int, void*>, void*> registered_;  // (device, data) -> handle; under calls_
  std::atomic<bool> stop_{false};  // an abort was asked for: loops that poll NCCL give up
  mutable Mutex status_mutex_;
  Status aborted_ GS_GUARDED_BY(status_mutex_);
  std::unique_ptr<Watchdog> watchdog_ GS_GUARDED_BY(status_mutex_);  // after connect();  for abort()
};

// Makes NCCL engines over the api given (the real NCCL in the daemon, a fake in tests).
class NcclEngineFactory final : public DeviceEngineFactory {
 public:
  // `keep`: how long idle communicators of an ended job are kept for its next generation (0:
  // not at all).
  NcclEngineFactory(std::unique_ptr<NcclApi> api, EngineTiming timing = {},
                    std::chrono::seconds keep = std::chrono::seconds(300))
      : api_(std::move(api)), timing_(timing), park_(api_.get(), keep) {}
  Status make(const DeviceEngineSpec& spec, std::unique_ptr<DeviceCollectiveEngine>* out) override {
    *out = std::make_unique<NcclEngine>(api_.get(), spec, timing_, &park_);
    return Status();
  }
  const CommPark& park() const { return park_; }

 private:
  std::unique_ptr<NcclApi> api_;
  EngineTiming timing_;
  CommPark park_;  // after api_, which it uses until it is gone
};

}  // namespace gradsync::nccl
