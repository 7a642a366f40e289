// The CUDA executor: buckets of sets in device memory. Clients that share a GPU are combined by
// this executor's kernels (in rank order, bit-identical to the host path); a group that spans
// several GPUs, here or on other nodes, goes through one NCCL communicator per (job, group, GPU
// layout), made at the admission of the first set of that layout and shared by every later one
// when every node agrees (DESIGN.md decision 6). Per bucket, on the daemon's stream of each GPU:
//   allreduce  gather (the GPU's participants) -> [NCCL allreduce] -> scatter (all of them)
//   reduce     gather -> [NCCL reduce to the root's GPU] -> scatter (the root only)
//   broadcast  gather (the root alone: a copy) -> [NCCL broadcast] -> scatter (all but the root)
// The launch tables (segments, work items) are built and uploaded once per (set, bucket, GPU,
// kind of launch) and reused every step; each GPU's bucket buffer grows to the largest bucket.
//
// Answers:
//   - device-ordered sets (the clients registered event rings), one GPU or several: answered
//     once the bucket is queued; its done events carry the order to the clients, so up to
//     kMaxQueued buckets per GPU are in flight at once. Each queued bucket holds its set, so no
//     client memory is unmapped while GPU work may touch it. Across GPUs the engine's watchdog
//     follows each bucket's event and, on an NCCL error or a hang, fails the job
//     asynchronously (`fail_job`), after aborting the communicators;
//   - other sets (tests, tools): one GPU: enqueue, synchronise the stream, answer; several:
//     the engine's watchdog answers when all GPUs are through, or with the error, after
//     draining the streams.
//
// Containment (one job's GPU work must never stall another job's on the same GPU):
//   - nothing here synchronises a device: memory is allocated and freed in stream order;
//   - no stream of the daemon's waits on a client's event: the clients' ready events are
//     polled from the host, with the execution bound, before the bucket's work is queued;
//   - a sticky CUDA error is reported to the GpuWatch, which fails every job on that GPU.
//
// Zero-copy: when every local GPU holds one participant of an allreduce bucket and the
// participants registered flat buffers, NCCL reduces in their memory directly (zero_copy()).
// Their VMM regions are offered to NCCL (ncclCommRegister) at admission; the log says whether
// NCCL took each.
//
// Ordering with the clients: through their interprocess event rings (events.h), registered with
// every device set. A one-GPU bucket is answered once it is queued (the done events carry the
// order to the clients); a multi-GPU bucket is answered by the watchdog when its GPUs are
// through, so that an NCCL failure fails the operation it belongs to. Sets without event rings
// (tests) are synchronised on the host before the answer.
//
// allgather goes source rank by source rank: a copy of its tensors into the bucket buffer on
// its GPU, a broadcast from there when the group spans GPUs, and a copy into every
// participant's output at that rank's slot.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <atomic>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "daemon/backend/cuda/across.h"
#include "daemon/backend/cuda/device_api.h"
#include "daemon/backend/cuda/gpu_watch.h"
#include "daemon/backend/cuda/health_table.h"
#include "daemon/backend/cuda/launcher.h"
#include "daemon/backend/executor.h"
#include "daemon/engine/device_engine.h"
#include "daemon/util/log.h"
#include "shared/mutex.h"

namespace gradsync::cuda {

struct CudaExecutorOptions {
  DeviceApi* api = nullptr;
  KernelLauncher* kernels = nullptr;
  // Makes the NCCL engines; null in a daemon without NCCL, which then refuses groups that span
  // GPUs.
  DeviceEngineFactory* engines = nullptr;
  // Where sticky CUDA errors are reported and heard of; null: not watched (tests).
  GpuWatch* gpus = nullptr;
  Logger log;
  // Fails the job from any thread, for failures found after a bucket was answered (a queued
  // bucket that failed on the GPU). Must not block; may be empty (tests).
  std::function<void(const Status&)> fail_job;
};

class CudaExecutor final : public BucketExecutor {
 public:
  explicit CudaExecutor(CudaExecutorOptions options);
  ~CudaExecutor() override;  // ends the engines (answering what is in flight), then frees
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Creates and connects the engine of every group of the set that spans GPUs.
  Status admit(const TensorSet& set, const SetAdmission& admission) override;
  void launch(BucketCall call, BucketDone done) override;
  // Frees the set's kernel and health tables in their streams' order (buckets queued before
  // may still read them) and forgets which engines served it; the engines stay, shared by
  // the sets of their layout.
  void retire_set(uint32_t set_id) override;
  void tidy() override { undo_registrations(); }
  void abort(const Status& why) override;
  // Waits, polling, until every stream of the executor's is through what it was given, or the
  // deadline; on a timeout it marks itself lost: the destructor then frees nothing.
  bool quiesce(std::chrono::steady_clock::time_point deadline) override;

 private:
  // One launch's table in device memory.
  struct Table {
    void* segments = nullptr;
    void* items = nullptr;
    uint64_t item_count = 0;
    uint32_t clients = 0;
  };
  // (set id, bucket, side, GPU, the one client of a root-only launch or -1, the root it skips
  // or -1, whether it counts bytes rather than elements)
  using TableKey = std::tuple<uint32_t, size_t, Side, int, int, int, bool>;
  // How the engine's watchdog has answered a queued multi-GPU bucket.
  enum Watched : int { kWatching = 0, kThrough = 1, kFailed = 2 };
  struct Queued {
    void* event = nullptr;  // recorded after the bucket's last kernel
    std::chrono::steady_clock::time_point since;
    std::string what;
    // Keeps the clients' memory mapped until the GPU is through the bucket.
    std::shared_ptr<const TensorSet> set;
    // Multi-GPU buckets: set by the watchdog's answer; the event is reused only after it, since
    // the watchdog polls it. Null for one-GPU buckets.
    std::shared_ptr<std::atomic<int>> watched;
  };
  struct Device {
    void* stream = nullptr;
    void* bucket_buffer = nullptr;
    size_t bucket_bytes = 0;
    // Wire compression: the compressed copy of the bucket buffer (2-byte elements), grown like
    // it. Its address is in the GPU's kWire tables, which are dropped when it grows.
    void* wire_buffer = nullptr;
    size_t wire_bytes = 0;
    void* done_event = nullptr;  // recorded after a bucket's last kernel (unordered sets, quiesce)
    // Buckets answered at enqueue, oldest first, at most kMaxQueued: how the executor bounds
    // the work ahead of the GPU and notices a stream that stopped moving.
    std::deque<Queued> queued;
    std::vector<void*> spare_events;
    // Buckets queued so far and those the GPU is through (popped from `queued`): a fence is
    // the `enqueued` of every GPU at some point, passed once each `finished` reaches it.
    uint64_t enqueued = 0;
    uint64_t finished = 0;
  };
  static constexpr size_t kMaxQueued = 8;

  // Retires finished buckets of `device`'s queue; with `room_for_one`, waits (polling) until the
  // queue has room, failing when its oldest bucket is older than the execution bound.
  Status retire(int device, bool room_for_one);
  // Queues a device-ordered bucket on `device` (an event recorded after its work); `watched`
  // as in Queued. *event is the event recorded.
  Status enqueue_answered(const BucketCall& call, int device, const std::string& what,
                          std::shared_ptr<std::atomic<int>> watched, void** event);
  // A failed device call: when the GPU's context is broken for good (a sticky error), the
  // GpuWatch hears of it and the answer says so; otherwise `status` as it is.
  Status on_device(int device, const Status& status);
  // The GpuWatch's listener: a GPU broke; this executor fails if it has work there.
  void gpu_broken(int device, const Status& why);

  // Device order with the clients (DESIGN.md decision 7), for a set whose clients registered
  // event rings: the bucket's kernels are queued once each of its participants' ready event of
  // the operation is through, and the stream records their done events after them.
  static bool device_ordered(const BucketCall& call);
  // Polls (host, bounded by the execution bound and the job's abort) until every participant
  // on `device` has its ready event of the operation through.
  Status await_ready(const BucketCall& call, int device);
  // ready: await_ready(); else the stream records every participant's done event.
  Status order(const BucketCall& call, int device, bool ready);
  Status wait_ready(const BucketCall& call, int device) { return order(call, device, true); }
  Status record_done(const BucketCall& call, int device) { return order(call, device, false); }

  // Fused health (call.health): the health kernel over the bucket's result as local rank
  // `reader` on `device` holds it, after the scatter and before the clients' done events (a
  // client may write its tensors again once its event fires). *state: its table, which
  // collect_health() reads once the GPU is through.
  Status enqueue_health(const BucketCall& call, int device, const HealthTableState** state);
  // The health kernel's table for the bucket on `device`, made on first use and kept; made
  // before anything of the bucket is queued (a first upload from pageable memory may wait for
  // the work already on the stream, which once a collective is queued includes the peers).
  Status health_table(const BucketCall& call, int device, const HealthTableState** state);
  // Answered at enqueue: a device-ordered set's bucket, unless it computes health (the answer
  // carries the health, so it waits for the GPU).
  bool answer_at_enqueue(const BucketCall& call) { return device_ordered(call) && !call.health; }
  // One GPU in all. Answers at enqueue when answer_at_enqueue(); otherwise after a stream
  // synchronisation.
  Status run_single(const BucketCall& call);
  // Several GPUs (this node's and others'), through `engine`: the skeleton every operation kind
  // shares, with the kind's AcrossPlanner (across.h) for what differs.
  void run_across(const BucketCall& call, DeviceCollectiveEngine* engine, BucketDone done);
  // run_across's steps: every local GPU readied (*buffers), then the planner's tables uploaded;
  // after the collective, the scatter, the done events and the GPUs' events to watch.
  Status ready_devices(DeviceCollectiveEngine& engine, size_t bytes, bool ordered,
                       std::vector<DeviceBuffer>* buffers);
  Status finish_across(const BucketCall& call, const AcrossPlanner& planner, const AcrossBucket& bucket,
                       std::span<const DeviceBuffer> buffers, const std::string& where,
                       const std::shared_ptr<std::atomic<int>>& watched, std::vector<std::pair<int, void*>>* events,
                       const HealthTableState** health);
  // The GPU whose copy of the result the health kernel reads: the first of `buffers` with a
  // participant.
  static int health_device(const BucketCall& call, std::span<const DeviceBuffer> buffers);
  // Answers a run_across bucket once the engine's watchdog saw its events through.
  void watch_across(DeviceCollectiveEngine& engine, const std::string& where,
                    std::shared_ptr<std::atomic<int>> watched, std::vector<std::pair<int, void*>> events,
                    std::span<const DeviceBuffer> buffers, BucketDone done);
  // allgather, one source rank at a time: its tensors into the bucket buffer on its GPU (when
  // `source_local` is a local rank there), then from the bucket buffer into every local
  // participant's output on `device`. Byte copies.
  // A masked reduction's destinations on `device` (every participant there; a reduce's root
  // only), each of the bucket's tensors zeroed before the scatter writes the kept elements.
  Status enqueue_zero(const BucketCall& call, int device, const Launches& launches);
  // Makes `device`'s wire buffer hold `bytes` (growing it drops the GPU's kWire tables, whose
  // segment holds its address; the old buffer and tables are freed in the stream's order).
  Status wire_buffer(int device, size_t bytes);

  // Wire compression around a collective: every GPU's bucket buffer (float32 sums) narrowed into
  // its kWire table's buffer, or widened back from it.
  Status enqueue_wire(const BucketCall& call, DType wire, bool narrow, std::span<const DeviceBuffer> buffers);
  Status enqueue_gather_from(const BucketCall& call, int device, int source_local);
  Status enqueue_scatter_gathered(const BucketCall& call, int device, int source_rank);
  // Enqueues one GPU's gather (before the collective) or scatter (after it), through the GPU's
  // bucket buffer or, zero-copy, through `bucket` (a client's own flat run).
  Status enqueue(const BucketCall& call, int device, Side side, const Launches& launches,
                 const reduce::KernelArgs& args, void* bucket = nullptr);
  // Zero-copy: an allreduce whose GPUs each hold one participant whose tensors are laid out as
  // the bucket (a flat buffer), in a type NCCL reduces as is (not the half types, which
  // accumulate in float32). NCCL then works in the clients' memory; a scaled avg divides in
  // place before or after it. Fills *runs with each local GPU's participant's run.
  static bool zero_copy(const BucketCall& call, std::span<const int> devices, std::vector<void*>* runs);
  // The GPU of a client's tensor, or -1; of a client's tensors of a bucket (its first's).
  static int device_of_address(const TensorSet& set, const std::byte* at);
  static int device_of_client(const TensorSet& set, size_t bucket, uint32_t client);
  Status device_of(const TensorSet& set, size_t bucket, int* device) const;
  Status device_state(int device, size_t bucket_bytes, Device** out);
  // The table of one side of a bucket on one GPU, uploaded on first use.
  Status table(const BucketCall& call, int device, Side side, int only, bool skip_root, bool bytes,
               const Table** out);
  DeviceCollectiveEngine* engine_of(uint32_t set, const std::string& group);
  // What makes two sets' communicators interchangeable on this node: the group, this node's GPUs
  // of it and each local rank's slot among them.
  static std::string layout_key(const std::string& group, const DeviceEngineSpec& spec);
  // admit(): when this node has an engine of the same layout and every node says the same, the
  // set uses it (*shared); otherwise the caller makes one, split off spec->parent when every
  // node named an engine that holds its GPUs there (the first such in node 0's creation order).
  Status share_engine(const TensorSet& set, const std::string& group, DeviceEngineSpec* spec,
                      const SetAdmission& admission, bool* shared);
  Status aborted();  // the abort's reason, ok while not aborted
  // Offers the set's VMM regions on the engine's GPUs to NCCL, logging whether it took each, and
  // records the set as a user of each registration.
  void register_regions(const TensorSet& set, DeviceCollectiveEngine& engine, const std::string& what);
  // retire_set(): the registrations the set was the last user of are fenced (every GPU's
  // buckets queued so far: one of them, of this set or of an earlier one, may still use the
  // memory) and undone once the GPUs are through; those NCCL never took are forgotten at once.
  void release_registrations(uint32_t set_id);
  // Undoes the fenced registrations whose fence the GPUs passed, letting go of their regions.
  // Never waits: called at each retirement and by tidy() (the worker about to sleep), so the
  // worker is never held (a peer may be waiting on it in a cross-node exchange).
  void undo_registrations();

  DeviceApi* api_;
  KernelLauncher* kernels_;
  DeviceEngineFactory* engine_factory_;
  GpuWatch* gpus_;
  Logger log_;
  std::function<void(const Status&)> fail_job_;
  Mutex mutex_;
  Status aborted_ GS_GUARDED_BY(mutex_);
  std::set<int> used_devices_ GS_GUARDED_BY(mutex_);  // GPUs this executor has work on
  // NCCL registrations of clients' VMM regions, by (engine, GPU, address): each keeps its
  // region mapped (so that no other memory appears at a registered address) until it is undone,
  // once no set of the engine uses it and the GPUs are through the buckets that might
  // (release_registrations). That is what lets a client free device memory before it leaves.
  // Worker thread only; declared before engines_ so that it goes after them (the destructor
  // ends the engines first, and with them their registrations).
  struct Registration {
    std::shared_ptr<const MemoryRegion> region;
    std::set<uint32_t> sets;  // the live sets that use it on the engine
    bool taken = false;       // NCCL registered it (a handle to undo), not only asked
    // Set once `sets` emptied: the `enqueued` then of each of the engine's GPUs, which its
    // `finished` must reach.
    std::optional<std::map<int, uint64_t>> fence;
    // Undos NCCL refused: tried again after a pause that doubles each time, kUndoTries times in
    // all; after that the region stays mapped until the job ends.
    int refusals = 0;
    std::chrono::steady_clock::time_point next_try;
  };
  static constexpr int kUndoTries = 5;
  std::map<std::tuple<DeviceCollectiveEngine*, int, const std::byte*>, Registration> registrations_;
  // Made on the worker thread; abort() reaches them under mutex_. One per (group, layout), by
  // its name; every set's (set, group) points at its engine, and each layout at the name of
  // the engine its sets share.
  std::map<std::string, std::unique_ptr<DeviceCollectiveEngine>> engines_;
  std::map<std::pair<uint32_t, std::string>, DeviceCollectiveEngine*> engine_by_set_;
  std::map<std::string, std::string> layouts_;
  std::vector<std::string> made_;  // the names of engines_ in creation order
  // Caller's thread only (the worker launches one bucket at a time).
  std::map<int, Device> devices_;
  std::map<TableKey, std::pair<int, Table>> tables_;  // with the device they live on
  // Fused health: (set id, bucket, GPU) -> the health kernel's table there.
  std::map<std::tuple<uint32_t, size_t, int>, HealthTableState> health_tables_;
  std::chrono::milliseconds watch_timeout_{30'000};    // the job timeout, from admit()
  std::chrono::milliseconds execution_timeout_{600'000};  // from admit()
  bool lost_ = false;  // quiesce() timed out: GPU work may still use everything; free nothing
  // Last: it goes first, ending the listener's calls before anything it reaches goes.
  GpuWatch::Subscription gpu_subscription_;
};

}  // namespace gradsync::cuda
