#include "daemon/backend/cuda/executor.h"

#include <cstdio>

#include <algorithm>
#include <iterator>
#include <set>
#include <sstream>

#include "daemon/backend/cuda/events.h"
#include "daemon/backend/cuda/kept_segments.h"
#include "daemon/backend/cuda/work_items.h"
#include "daemon/reduce/staged.h"
#include "shared/backoff.h"

namespace gradsync::cuda {
namespace {

// Ok, or why `device` is broken for good (a sticky error, then reported to `gpus` if there is
// one). Shared by the executor's own calls and its callbacks on the engine's watchdog thread.
Status broken_gpu(DeviceApi* api, GpuWatch* gpus, int device) {
  Status health = api->health(device);
  if (!health.ok() && gpus) gpus->report(device, health);
  return health;
}

// The outputs an allgather or a reduce-scatter writes, registered by every client (check_op
// asks the same of the set as a whole).
Status outputs_registered(const BucketCall& call, const std::string& where) {
  const TensorSet& set = *call.set;
  if (call.desc.kind == OpKind::kAllgather && set.gather_output.size() != set.address.size()) {
    return Status::invalid_argument(where + " was registered without allgather outputs");
  }
  if (call.desc.kind == OpKind::kReduceScatter && set.shard_output.size() != set.address.size()) {
    return Status::invalid_argument(where + " was registered without reduce-scatter outputs");
  }
  return Status();
}

// Each of `clients`' parts of the bucket, to its shard output (Side::kScatterShards).
std::vector<Segment> shard_segments(const TensorSet& set, size_t bucket, const std::vector<uint32_t>& clients) {
  std::vector<Segment> segments;
  const size_t element = dtype_size(set.plan.buckets[bucket].dtype);
  for (uint32_t c : clients) {
    for (const ShardPiece& piece : shard_pieces(set, bucket, c)) {
      Segment s;
      s.bucket_offset = set.offset_in_bucket[piece.tensor] + piece.first;
      s.count = piece.count;
      s.address[0] = set.shard_output[c] + piece.at * element;
      segments.push_back(s);
    }
  }
  return segments;
}

const char* kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kReduceScatter: return "reduce_scatter";
  }
  return "operation";
}

}  // namespace

CudaExecutor::CudaExecutor(CudaExecutorOptions options)
    : api_(options.api),
      kernels_(options.kernels),
      engine_factory_(options.engines),
      gpus_(options.gpus),
      log_(std::move(options.log)),
      fail_job_(std::move(options.fail_job)) {
  if (gpus_) {
    gpu_subscription_ = gpus_->subscribe([this](int device, const Status& why) { gpu_broken(device, why); });
  }
}

CudaExecutor::~CudaExecutor() {
  gpu_subscription_.reset();  // no listener call reaches a half-destroyed executor
  if (lost_) {
    // GPU work may still use all of it, NCCL's buffers included: leaked on purpose (quiesce()).
    MutexLock lock(mutex_);
    for (auto& [key, engine] : engines_) engine.release()->abandon();
    return;
  }
  // The engines first: each answers its bucket in flight (draining the streams) after aborting
  // its communicators, so nothing below is freed under a running kernel.
  std::map<std::string, std::unique_ptr<DeviceCollectiveEngine>> engines;
  {
    MutexLock lock(mutex_);
    engines.swap(engines_);
    engine_by_set_.clear();
    made_.clear();
  }
  for (auto& [key, engine] : engines) engine->abort(Status::aborted("the job's CUDA executor was closed"));
  engines.clear();
  // Each stream holds only this executor's kernels and NCCL's aborted work (no stream of the
  // daemon's ever waits on a client's event): its synchronisation is bounded, and it is the
  // stream's, never the device's.
  for (auto& [device, state] : devices_) {
    if (state.stream) (void)api_->synchronize(device, state.stream);
  }
  // Freed in the stream's order, so no device synchronisation here either.
  for (auto& [key, entry] : tables_) {
    void* stream = devices_.at(entry.first).stream;
    (void)api_->free(entry.first, entry.second.segments, stream);
    (void)api_->free(entry.first, entry.second.items, stream);
  }
  for (auto& [key, table] : health_tables_) {
    const int device = std::get<2>(key);
    free_health_table(api_, device, devices_.at(device).stream, table);
  }
  for (auto& [device, state] : devices_) {
    if (state.bucket_buffer) (void)api_->free(device, state.bucket_buffer, state.stream);
    if (state.wire_buffer) (void)api_->free(device, state.wire_buffer, state.stream);
    if (state.done_event) (void)api_->destroy_event(device, state.done_event);
    for (const Queued& q : state.queued) (void)api_->destroy_event(device, q.event);
    for (void* e : state.spare_events) (void)api_->destroy_event(device, e);
    if (state.stream) {
      // The frees above run once the stream reaches them (it is idle by now): then the pool
      // can give this job's memory back to the driver, rather than keep it for the daemon's life.
      (void)api_->synchronize(device, state.stream);
      (void)api_->destroy_stream(device, state.stream);
    }
    (void)api_->trim(device);
  }
}

Status CudaExecutor::on_device(int device, const Status& status) {
  if (status.ok()) return status;
  const Status broken = broken_gpu(api_, gpus_, device);
  return broken.ok() ? status : broken;
}

void CudaExecutor::gpu_broken(int device, const Status& why) {
  {
    MutexLock lock(mutex_);
    if (!used_devices_.count(device)) return;
  }
  abort(why);
  if (fail_job_) fail_job_(why);
}

bool CudaExecutor::quiesce(std::chrono::steady_clock::time_point deadline) {
  if (lost_) return false;
  for (auto& [device, state] : devices_) {
    if (!state.stream) continue;
    // Anything but a clean "through" counts as not drained: a failed CUDA call says nothing
    // about what the GPU may still touch.
    Status made = state.done_event ? Status() : api_->create_event(device, &state.done_event);
    if (made.ok()) made = api_->record_event(device, state.done_event, state.stream);
    bool ok = on_device(device, made).ok();
    Backoff backoff({.max_sleep = std::chrono::microseconds(1000)});
    for (;;) {
      bool done = false;
      if (ok) {
        const Status polled = api_->query_event(device, state.done_event, &done);
        ok = polled.ok();
        if (!ok) (void)on_device(device, polled);
      }
      if (ok && done) break;
      if (!ok || std::chrono::steady_clock::now() >= deadline) {
        lost_ = true;
        log_.error("GPU " + std::to_string(device) + ": the daemon's stream did not drain in time (an NCCL "
                   "collective or a kernel that does not end?); the job's GPU resources and client memory stay "
                   "allocated until gradsyncd restarts");
        return false;
      }
      backoff.pause();
    }
    for (const Queued& q : state.queued) state.spare_events.push_back(q.event);
    state.queued.clear();  // and with them the sets they held
    state.finished = state.enqueued;
  }
  return true;
}

Status CudaExecutor::retire(int device, bool room_for_one) {
  Device& state = devices_.at(device);
  Backoff backoff;
  for (;;) {
    while (!state.queued.empty()) {
      const Queued& head = state.queued.front();
      // A multi-GPU bucket's event is the watchdog's until it answered.
      if (head.watched && head.watched->load() == kWatching) break;
      bool done = false;
      if (Status s = api_->query_event(device, head.event, &done); !s.ok()) return on_device(device, s);
      if (!done) break;
      state.spare_events.push_back(head.event);
      state.queued.pop_front();  // the bucket's set may go now: the GPU is through it
      ++state.finished;
      backoff.reset();
    }
    if (!room_for_one || state.queued.size() < kMaxQueued) return Status();
    if (Status why = aborted(); !why.ok()) return why;  // the job is failing: no more waiting
    const Queued& oldest = state.queued.front();
    // The watchdog's and the worker's bound for a bucket (a cross-node peer may be as late as
    // the execution bound lets it, and the transfer takes up to the job timeout), not less.
    if (std::chrono::steady_clock::now() - oldest.since > watch_timeout_) {
      return Status::timeout(oldest.what + " on GPU " + std::to_string(device) + " was queued " +
                             std::to_string(watch_timeout_.count()) +
                             " ms ago (the execution bound plus the job timeout) and has not finished on the GPU");
    }
    backoff.pause();
  }
}

Status CudaExecutor::enqueue_answered(const BucketCall& call, int device, const std::string& what,
                                      std::shared_ptr<std::atomic<int>> watched, void** event) {
  Device& state = devices_.at(device);
  Queued q{nullptr, std::chrono::steady_clock::now(), what, call.set, std::move(watched)};
  Status status;
  if (!state.spare_events.empty()) {
    q.event = state.spare_events.back();
    state.spare_events.pop_back();
  } else {
    status = api_->create_event(device, &q.event);
  }
  if (status.ok()) status = api_->record_event(device, q.event, state.stream);
  if (!status.ok()) {
    if (q.event) state.spare_events.push_back(q.event);
    return on_device(device, status);
  }
  *event = q.event;
  state.queued.push_back(std::move(q));
  ++state.enqueued;
  return Status();
}

bool CudaExecutor::device_ordered(const BucketCall& call) {
  const TensorSet& set = *call.set;
  if (set.events.empty()) return false;
  for (uint32_t c : set.participants[call.bucket]) {
    if (c >= set.events.size() || !set.events[c]) return false;
  }
  return true;
}

Status CudaExecutor::await_ready(const BucketCall& call, int device) {
  const TensorSet& set = *call.set;
  // The clients' ready events are polled from the host, and no stream of the daemon's ever
  // waits on one: a client killed mid-step leaves its record unexecuted for good, and a GPU
  // wait on it would stay in the context every job on this GPU shares (any later implicit
  // device synchronisation, NCCL's teardown included, would hang on it). The cost: a client
  // that goes on marking later tensors of the operation re-records the event, so the poll
  // may see a later point of its stream than the one this bucket needed.
  const auto since = std::chrono::steady_clock::now();
  for (uint32_t c : set.participants[call.bucket]) {
    if (device_of_client(set, call.bucket, c) != device) continue;
    // Made by the backend factory for device sets only, so the cast holds.
    const auto* rings = static_cast<const ClientEventRings*>(set.events[c].get());
    Backoff backoff;
    for (;;) {
      bool done = false;
      if (Status s = rings->ready().query(call.seq, &done); !s.ok()) {
        return on_device(device, Status(s.code(), "local rank " + std::to_string(c) + "'s ready event: " + s.message()));
      }
      if (done) break;
      if (Status stop = aborted(); !stop.ok()) return stop;
      if (std::chrono::steady_clock::now() - since > execution_timeout_) {
        return Status::timeout("local rank " + std::to_string(c) + " announced its tensors of operation " +
                               std::to_string(call.seq) + " ready, but the work before that on its stream did not "
                               "finish within " + std::to_string(execution_timeout_.count()) +
                               " ms (the execution bound)");
      }
      backoff.pause();
    }
  }
  // Through: the clients' writes are complete and visible to anything launched from now on.
  return Status();
}

Status CudaExecutor::order(const BucketCall& call, int device, bool ready) {
  if (!device_ordered(call)) return Status();
  if (ready) return await_ready(call, device);
  const TensorSet& set = *call.set;
  void* stream = devices_.at(device).stream;
  for (uint32_t c : set.participants[call.bucket]) {
    if (device_of_client(set, call.bucket, c) != device) continue;
    const auto* rings = static_cast<const ClientEventRings*>(set.events[c].get());
    if (Status s = rings->done().record(call.seq, stream); !s.ok()) {
      return Status(s.code(), "recording local rank " + std::to_string(c) + "'s done event: " + s.message());
    }
  }
  return Status();
}

Status CudaExecutor::aborted() {
  MutexLock lock(mutex_);
  return aborted_;
}

void CudaExecutor::abort(const Status& why) {
  MutexLock lock(mutex_);
  if (!aborted_.ok()) return;
  aborted_ = why.ok() ? Status::aborted("aborted") : why;
  for (auto& [key, engine] : engines_) engine->abort(aborted_);
}

int CudaExecutor::device_of_address(const TensorSet& set, const std::byte* at) {
  for (const auto& region : set.regions) {
    if (at >= region->base() && at < region->base() + region->size()) return region->device();
  }
  return -1;
}

int CudaExecutor::device_of_client(const TensorSet& set, size_t bucket, uint32_t client) {
  // admit() checked that all of a client's tensors of the bucket's group are on one GPU.
  const auto& tensors = set.plan.buckets[bucket].tensors;
  return tensors.empty() ? -1 : device_of_address(set, set.address[client][tensors.front()]);
}

Status CudaExecutor::admit(const TensorSet& set, const SetAdmission& admission) {
  // The watchdog's bound for a bucket: waiting for the slowest peer plus the transfer, as the
  // worker's execution bound allows it (a peer late in its backward pass is not a hang).
  watch_timeout_ = admission.execution_timeout + admission.timeout;
  execution_timeout_ = admission.execution_timeout;
  std::set<std::string> names;
  for (const auto& bucket : set.plan.buckets) names.insert(bucket.group);
  // In the same order on every node, so that communicators are created in the same order
  // everywhere: "dp" (all ranks) first, as the likeliest parent of the others, then sorted.
  std::vector<std::string> groups(names.begin(), names.end());
  std::stable_partition(groups.begin(), groups.end(), [](const std::string& g) { return g == "dp"; });
  for (const std::string& group : groups) {
    std::map<uint32_t, int> gpu_of;  // local rank -> GPU
    for (size_t b = 0; b < set.plan.buckets.size(); ++b) {
      if (set.plan.buckets[b].group != group) continue;
      for (uint32_t c : set.participants[b]) {
        for (uint32_t t : set.plan.buckets[b].tensors) {
          const int d = device_of_address(set, set.address[c][t]);
          if (d < 0) {
            return Status::internal(set.name() + ": tensor " + std::to_string(t) +
                                    " of local rank " + std::to_string(c) + " is in no device region");
          }
          auto [it, inserted] = gpu_of.emplace(c, d);
          if (!inserted && it->second != d) {
            return Status::invalid_argument(set.name() + ": local rank " + std::to_string(c) +
                                            " has tensors on GPUs " + std::to_string(it->second) + " and " +
                                            std::to_string(d) + "; a client's tensors of one set must be on one GPU");
          }
        }
      }
    }
    std::vector<int> devices;
    for (const auto& [c, d] : gpu_of) devices.push_back(d);
    std::sort(devices.begin(), devices.end());
    devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
    // One GPU on the only node: the kernels alone do it.
    if (admission.rendezvous->nodes() <= 1 && devices.size() <= 1) continue;
    const std::string what = "job " + admission.job + " " + set.name() + " group '" + group + "'";
    if (!engine_factory_) {
      return Status::not_supported(what + " spans " + std::to_string(devices.size()) + " GPUs here and " +
                                   std::to_string(admission.rendezvous->nodes()) +
                                   " nodes; this gradsyncd has no NCCL engine");
    }
    DeviceEngineSpec spec;
    // The engine may serve later sets of this layout too: its messages name the job and group.
    spec.what = "job " + admission.job + " group '" + group + "'";
    // Length-prefixed, so that no group name can make another's.
    spec.name = "nccl/s" + std::to_string(set.id) + "/" + std::to_string(group.size()) + ":" + group;
    spec.devices = devices;
    spec.slot_of_local_rank.assign(static_cast<size_t>(admission.topology->local_world_size), -1);
    for (const auto& [c, d] : gpu_of) {
      spec.slot_of_local_rank[c] = static_cast<int>(std::find(devices.begin(), devices.end(), d) - devices.begin());
    }
    spec.timeout = admission.timeout;
    spec.enqueue_timeout = admission.execution_timeout + admission.timeout;
    if (engine_of(set.id, group)) continue;  // admitted before
    // One communicator per (job, group, GPU layout), shared by every set of that layout: a DDP
    // job registers one set per DDP bucket, and a communicator each would multiply NCCL's
    // buffers and bootstrap by the bucket count. Another layout splits off an engine that holds
    // its GPUs where there is one.
    bool shared = false;
    if (Status status = share_engine(set, group, &spec, admission, &shared); !status.ok() || shared) {
      if (!status.ok()) return status;
      continue;
    }
    // The owner, the job and the engine's name (the group and the set that made it) name the
    // engine in every generation of the job: a restarted trainer registers the same sets, in
    // the same order, so the same set makes the engine of each layout again. The engine adds
    // its GPUs and slots (nccl/park.h). Two engines of one layout (made after the nodes
    // disagreed) keep two keys. Length-prefixed, so no job or group name can make another's.
    if (!admission.owner_job.empty()) {
      spec.reuse_key = std::to_string(admission.owner_job.size()) + ":" + admission.owner_job + "/" +
                       std::to_string(spec.name.size()) + ":" + spec.name;
    }
    std::unique_ptr<DeviceCollectiveEngine> made;
    if (Status status = engine_factory_->make(spec, &made); !status.ok()) return status;
    DeviceCollectiveEngine* engine = made.get();
    {
      MutexLock lock(mutex_);
      if (!aborted_.ok()) return aborted_;
      engine_by_set_[{set.id, group}] = engine;
      layouts_[layout_key(group, spec)] = spec.name;
      engines_.emplace(spec.name, std::move(made));
      made_.push_back(spec.name);
    }
    const auto started = std::chrono::steady_clock::now();
    if (Status status = engine->connect(admission.rendezvous); !status.ok()) return status;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    std::string here;
    for (int d : devices) here += (here.empty() ? "" : ",") + std::to_string(d);
    char took[96];
    std::snprintf(took, sizeof took, engine->reused() ? "kept from the job's previous run, re-joined in rejoin_ms=%.3f"
                                                      : "connected in connect_ms=%.3f",
                  ms);
    std::string from;
    if (spec.parent && engine->split()) {
      MutexLock lock(mutex_);
      for (const auto& [name, e] : engines_) {
        if (e.get() == spec.parent) from = ", split off the one made for " + name + " (sharing its resources)";
      }
    }
    log_.info(what + ": NCCL communicator of " + std::to_string(engine->ranks()) + " GPUs, this node's: " +
              (here.empty() ? "none" : here) + "; " + took + from);
    if (engine->ranks() > 1) register_regions(set, *engine, what);
  }
  return Status();
}

void CudaExecutor::retire_set(uint32_t set_id) {
  if (lost_) return;  // GPU work that never drained may still read them: kept, as in the destructor
  release_registrations(set_id);
  for (auto it = tables_.begin(); it != tables_.end();) {
    if (std::get<0>(it->first) != set_id) {
      ++it;
      continue;
    }
    const int device = it->second.first;
    void* stream = devices_.at(device).stream;
    (void)api_->free(device, it->second.second.segments, stream);
    (void)api_->free(device, it->second.second.items, stream);
    it = tables_.erase(it);
  }
  for (auto it = health_tables_.begin(); it != health_tables_.end();) {
    if (std::get<0>(it->first) != set_id) {
      ++it;
      continue;
    }
    const int device = std::get<2>(it->first);
    free_health_table(api_, device, devices_.at(device).stream, it->second);
    it = health_tables_.erase(it);
  }
  MutexLock lock(mutex_);
  std::erase_if(engine_by_set_, [set_id](const auto& entry) { return entry.first.first == set_id; });
}

void CudaExecutor::release_registrations(uint32_t set_id) {
  for (auto& [key, registration] : registrations_) {
    if (registration.sets.erase(set_id) == 0 || !registration.sets.empty()) continue;
    // The engine's GPUs: the region's own, where the executor's kernels read it, and those NCCL
    // reaches it from.
    std::map<int, uint64_t> fence;
    for (int device : std::get<0>(key)->devices()) {
      if (auto it = devices_.find(device); it != devices_.end()) fence[device] = it->second.enqueued;
    }
    registration.fence = std::move(fence);
  }
  undo_registrations();
}

void CudaExecutor::undo_registrations() {
  if (std::none_of(registrations_.begin(), registrations_.end(),
                   [](const auto& entry) { return entry.second.fence.has_value(); })) {
    return;
  }
  for (const auto& [device, state] : devices_) (void)retire(device, false);  // polls, never waits
  const auto now = std::chrono::steady_clock::now();
  for (auto it = registrations_.begin(); it != registrations_.end();) {
    const auto& [engine, device, base] = it->first;
    Registration& registration = it->second;
    bool passed = registration.fence.has_value() && registration.refusals < kUndoTries && now >= registration.next_try;
    // What NCCL never took has no handle: nothing of NCCL's can use the memory through it.
    if (passed && registration.taken) {
      for (const auto& [d, enqueued] : *registration.fence) passed = passed && devices_.at(d).finished >= enqueued;
    }
    if (!passed) {
      ++it;
      continue;
    }
    const Status status = engine->deregister_buffer(device, const_cast<std::byte*>(base));
    if (!status.ok()) {
      // Kept (the engine may still hold it), and tried again later, a few times.
      ++registration.refusals;
      registration.next_try = now + std::chrono::seconds(1) * (1 << registration.refusals);
      log_.warning("a " + std::to_string(registration.region->size()) + "-byte VMM region on GPU " +
                   std::to_string(device) + " stays mapped, registered with NCCL (" + status.message() + "); " +
                   (registration.refusals < kUndoTries ? "tried again in " + std::to_string(1 << registration.refusals) + " s"
                                                       : std::string("given up: its memory is freed when the job ends")));
      ++it;
      continue;
    }
    it = registrations_.erase(it);  // the region goes once nothing else holds it
  }
}

void CudaExecutor::register_regions(const TensorSet& set, DeviceCollectiveEngine& engine, const std::string& what) {
  // VMM imports only: NCCL registers through cuMemRetainAllocationHandle, which legacy IPC
  // openings do not support when one process drives several GPUs (GPU-NOTES.md).
  const std::span<const int> devices = engine.devices();
  for (const auto& region : set.regions) {
    if (region->kind() != MemoryKind::kCudaVmm) continue;
    if (std::find(devices.begin(), devices.end(), region->device()) == devices.end()) continue;
    Registration& registration = registrations_[{&engine, region->device(), region->base()}];
    const bool known = registration.region != nullptr;
    registration.sets.insert(set.id);
    registration.fence.reset();  // a released one in use again stays registered
    if (known) continue;  // offered for an earlier set, still registered
    registration.region = region;
    bool registered = false;
    const Status status = engine.register_buffer(region->device(), region->base(), region->size(), &registered);
    registration.taken = registered;
    log_.info(what + ": a " + std::to_string(region->size()) + "-byte VMM region on GPU " +
              std::to_string(region->device()) + (registered ? " is registered with NCCL for zero-copy"
                                                             : " is not registered with NCCL (" +
                                                                   (status.ok() ? std::string("refused")
                                                                                : status.message()) +
                                                                   "); NCCL copies through its own buffers"));
  }
}

DeviceCollectiveEngine* CudaExecutor::engine_of(uint32_t set, const std::string& group) {
  MutexLock lock(mutex_);
  auto it = engine_by_set_.find({set, group});
  return it == engine_by_set_.end() ? nullptr : it->second;
}

std::string CudaExecutor::layout_key(const std::string& group, const DeviceEngineSpec& spec) {
  std::string key = std::to_string(group.size()) + ":" + group + "|gpus";
  for (int d : spec.devices) key += " " + std::to_string(d);
  key += "|slots";
  for (int s : spec.slot_of_local_rank) key += " " + std::to_string(s);
  return key;
}

namespace {

// The "<name>/share" offer: "<engine> <engine> ...;<engine>": this node's engines (by name, in
// creation order) that the set's engine could be split off, then the name of the engine of its
// layout, or "-". Engine names ("nccl/s<set>/<len>:<group>") hold no space or ';' (group
// names are letters, digits, '-', '_' and '.'), and name the same engine on every node; a
// node's list may differ from another's (a set it keeps in another executor, by memory kind).
std::string share_offer(const std::vector<std::string>& parents, const std::string& same) {
  std::string text;
  for (const std::string& name : parents) text += (text.empty() ? "" : " ") + name;
  return text + ";" + same;
}

bool decode_share_offer(const std::string& text, std::vector<std::string>* parents, std::string* same) {
  const size_t semicolon = text.find(';');
  if (semicolon == std::string::npos) return false;
  *same = text.substr(semicolon + 1);
  if (same->empty() || same->find_first_of(" ;") != std::string::npos) return false;
  std::istringstream in(text.substr(0, semicolon));
  std::string name;
  while (in >> name) parents->push_back(name);
  return true;
}

}  // namespace

Status CudaExecutor::share_engine(const TensorSet& set, const std::string& group, DeviceEngineSpec* spec,
                                  const SetAdmission& admission, bool* shared) {
  *shared = false;
  std::string mine = "-";
  DeviceCollectiveEngine* engine = nullptr;
  std::vector<std::string> parents;  // this node's engines that hold the set's GPUs, oldest first
  std::vector<std::pair<std::string, DeviceCollectiveEngine*>> made;
  {
    MutexLock lock(mutex_);
    if (!aborted_.ok()) return aborted_;
    if (auto it = layouts_.find(layout_key(group, *spec)); it != layouts_.end()) {
      mine = it->second;
      engine = engines_.at(it->second).get();
    }
    for (const std::string& name : made_) made.emplace_back(name, engines_.at(name).get());
  }
  for (const auto& [name, candidate] : made) {
    const std::span<const int> has = candidate->devices();
    const bool holds = std::all_of(spec->devices.begin(), spec->devices.end(), [&](int d) {
      return std::find(has.begin(), has.end(), d) != has.end();
    });
    if (holds && candidate->splittable()) parents.push_back(name);
  }
  // Every node offers the engine it would share (by its name, which names the set that made it,
  // so it is the same on every node that made it then), and shares only if all offer the same:
  // a node whose GPUs of the group changed makes a fresh one, and so then does everybody.
  // Otherwise the parent is the first engine of node 0's list that every node lists. A
  // single-node job has nobody to ask.
  const std::string offer = share_offer(parents, mine);
  std::vector<std::string> offers{offer};
  if (admission.rendezvous->nodes() > 1) {
    if (Status status = admission.rendezvous->exchange(spec->name + "/share", offer, &offers); !status.ok()) {
      return Status(status.code(), spec->what + ": agreeing on a communicator to share: " + status.message(),
                    status.where());
    }
  }
  bool same = engine != nullptr;
  std::vector<std::vector<std::string>> lists;
  for (size_t n = 0; n < offers.size(); ++n) {
    std::vector<std::string> theirs;
    std::string their_same;
    if (!decode_share_offer(offers[n], &theirs, &their_same)) {
      return Status::protocol(spec->what + ": node " + std::to_string(n) +
                              " offered an undecodable communicator to share: '" + offers[n] + "'");
    }
    if (their_same != mine) same = false;
    lists.push_back(std::move(theirs));
  }
  if (!same) {
    for (const std::string& name : lists.front()) {
      const bool everywhere = std::all_of(lists.begin(), lists.end(), [&](const std::vector<std::string>& l) {
        return std::find(l.begin(), l.end(), name) != l.end();
      });
      if (!everywhere) continue;
      // Every node lists it, this one included: it is this node's engine of that name.
      for (const auto& [mine_name, candidate] : made) {
        if (mine_name == name) spec->parent = candidate;
      }
      break;
    }
    return Status();
  }
  {
    MutexLock lock(mutex_);
    engine_by_set_[{set.id, group}] = engine;
  }
  log_.info(spec->what + ": shares the NCCL communicator of " + std::to_string(engine->ranks()) + " GPUs made for " +
            mine);
  if (engine->ranks() > 1) register_regions(set, *engine, spec->what);
  *shared = true;
  return Status();
}

void CudaExecutor::launch(BucketCall call, BucketDone done) {
  Status status;
  {
    MutexLock lock(mutex_);
    status = aborted_;
  }
  if (!status.ok()) return done(status);
  DeviceCollectiveEngine* engine = engine_of(call.set->id, call.set->plan.buckets[call.bucket].group);
  if (engine && engine->ranks() > 1) return run_across(call, engine, std::move(done));
  done(run_single(call));
}

Status CudaExecutor::device_of(const TensorSet& set, size_t bucket, int* device) const {
  std::set<int> devices;
  for (uint32_t c : set.participants[bucket]) devices.insert(device_of_client(set, bucket, c));
  if (devices.size() != 1 || *devices.begin() < 0) {
    std::string list;
    for (int d : devices) list += (list.empty() ? "" : " and ") + std::to_string(d);
    return Status::internal("bucket " + std::to_string(bucket) + " of " + set.name() +
                            " has participants on GPUs " + list + " but no NCCL communicator");
  }
  *device = *devices.begin();
  return Status();
}

Status CudaExecutor::device_state(int device, size_t bucket_bytes, Device** out) {
  if (gpus_) {
    if (Status broken = gpus_->broken(device); !broken.ok()) return broken;
  }
  Device& state = devices_[device];
  if (!state.stream) {
    {
      MutexLock lock(mutex_);
      used_devices_.insert(device);
    }
    if (Status s = api_->create_stream(device, &state.stream); !s.ok()) return on_device(device, s);
  }
  if (state.bucket_bytes < bucket_bytes) {
    // In the stream's order: buckets queued before still use the old buffer, and the free
    // waits for them on the GPU, not here (a cudaFree would wait for the whole device).
    if (state.bucket_buffer) (void)api_->free(device, state.bucket_buffer, state.stream);
    state.bucket_buffer = nullptr;
    state.bucket_bytes = 0;
    if (Status s = api_->allocate(device, bucket_bytes, state.stream, &state.bucket_buffer); !s.ok()) {
      return on_device(device, s);
    }
    state.bucket_bytes = bucket_bytes;
  }
  *out = &state;
  return Status();
}

Status CudaExecutor::table(const BucketCall& call, int device, Side side, int only, bool skip_root, bool bytes,
                           const Table** out) {
  const TensorSet& set = *call.set;
  const uint32_t root = static_cast<uint32_t>(call.desc.root % call.topology->local_world_size);
  const TableKey key{set.id, call.bucket, side, device, only, skip_root ? static_cast<int>(root) : -1, bytes};
  if (auto it = tables_.find(key); it != tables_.end()) {
    *out = &it->second.second;
    return Status();
  }
  const plan::Bucket& bucket = set.plan.buckets[call.bucket];
  std::vector<uint32_t> clients;
  for (uint32_t c : set.participants[call.bucket]) {
    if (device_of_client(set, call.bucket, c) != device) continue;
    // For kScatterGathered `only` names the source rank's slot, not a client.
    if (side != Side::kScatterGathered && only >= 0 && c != static_cast<uint32_t>(only)) continue;
    if (skip_root && c == root) continue;
    clients.push_back(c);
  }
  if (clients.size() > kMaxClientsPerDevice) {
    return Status::not_supported(std::to_string(clients.size()) + " clients share one GPU; at most " +
                                 std::to_string(kMaxClientsPerDevice) + " may");
  }
  const uint64_t unit = bytes ? dtype_size(bucket.dtype) : 1;  // a byte table counts bytes
  std::vector<Segment> segments;
  if (side == Side::kWire) {
    // One segment, the whole bucket buffer, against the GPU's wire buffer (wire_buffer() made
    // it large enough for this bucket; the half types are both 2 bytes).
    Segment s;
    s.count = set.reduced_elements(call.bucket);
    s.address[0] = devices_.at(device).wire_buffer;
    segments.push_back(s);
    clients.assign(1, 0);
  } else if (set.masked() && !bytes && (side == Side::kGather || side == Side::kScatter)) {
    // A masked reduction moves the kept elements only, through a compact bucket buffer.
    segments = kept_segments(set, call.bucket, clients);
  } else if (side == Side::kScatterShards) {
    segments = shard_segments(set, call.bucket, clients);
    // The table's one "client" column: every piece has its own destination.
    clients.assign(segments.empty() ? 0 : 1, 0);
  } else {
    for (uint32_t t : bucket.tensors) {
      Segment s;
      s.bucket_offset = set.offset_in_bucket[t] * unit;
      s.count = set.layout[t].numel * unit;
      for (size_t k = 0; k < clients.size(); ++k) {
        s.address[k] = side == Side::kScatterGathered
                           ? set.gather_output[clients[k]] + static_cast<uint64_t>(only) * set.packed_bytes +
                                 set.packed_offset[t]
                           : set.address[clients[k]][t];
      }
      segments.push_back(s);
    }
  }
  const std::vector<WorkItem> items = cut_into_items(segments);
  Table table;
  table.item_count = items.size();
  table.clients = static_cast<uint32_t>(clients.size());
  // On the GPU's stream, like everything else: no device synchronisation (device_state() made
  // the stream before any table is asked for).
  void* stream = devices_.at(device).stream;
  Status status =
      api_->allocate(device, std::max<size_t>(1, segments.size()) * sizeof(Segment), stream, &table.segments);
  if (status.ok()) {
    status = api_->allocate(device, std::max<size_t>(1, items.size()) * sizeof(WorkItem), stream, &table.items);
  }
  if (status.ok()) {
    status = api_->upload(device, table.segments, segments.data(), segments.size() * sizeof(Segment), stream);
  }
  if (status.ok()) status = api_->upload(device, table.items, items.data(), items.size() * sizeof(WorkItem), stream);
  if (!status.ok()) {
    if (table.segments) (void)api_->free(device, table.segments, stream);
    if (table.items) (void)api_->free(device, table.items, stream);
    return on_device(device, status);
  }
  auto [it, inserted] = tables_.emplace(key, std::make_pair(device, table));
  *out = &it->second.second;
  return Status();
}

bool CudaExecutor::zero_copy(const BucketCall& call, std::span<const int> devices, std::vector<void*>* runs) {
  const TensorSet& set = *call.set;
  const size_t b = call.bucket;
  const DType dtype = set.plan.buckets[b].dtype;
  if (call.desc.kind != OpKind::kAllreduce || set.masked() || !set.canonical_run[b] || set.runs[b].empty() ||
      reduce::accumulation_dtype(dtype) != dtype) {
    return false;
  }
  runs->clear();
  for (int device : devices) {
    void* run = nullptr;
    for (uint32_t c : set.participants[b]) {
      if (device_of_client(set, b, c) != device) continue;
      if (run) return false;  // two clients share this GPU: they are combined through the buffer
      run = set.runs[b][0].address[c];
    }
    if (!run) return false;
    runs->push_back(run);
  }
  return true;
}

Status CudaExecutor::enqueue(const BucketCall& call, int device, Side side, const Launches& launches,
                             const reduce::KernelArgs& args, void* bucket) {
  const bool gather = side == Side::kGather;
  if (gather ? !launches.gather : !launches.scatter) return Status();
  const Table* t = nullptr;
  Status status;
  if (gather) {
    status = table(call, device, side, launches.only, false, launches.bytes, &t);
  } else if (launches.scatter_shards) {
    status = table(call, device, Side::kScatterShards, -1, false, false, &t);
  } else {
    status = table(call, device, side, launches.scatter_only, launches.scatter_skips_root, launches.bytes, &t);
  }
  if (!status.ok() || t->clients == 0) return status;
  Device& state = devices_.at(device);
  if (!gather && !launches.scatter_shards && !launches.bytes && call.set->masked()) {
    // The seeds' temp_zero[mask] = reduced: every other element of a destination is zero.
    if (Status s = enqueue_zero(call, device, launches); !s.ok()) return s;
  }
  const BucketTable bucket_table{static_cast<const Segment*>(t->segments), static_cast<const WorkItem*>(t->items),
                                 t->item_count, t->clients, bucket ? bucket : state.bucket_buffer};
  return gather ? kernels_->gather(args, bucket_table, state.stream)
                : kernels_->scatter(args, bucket_table, state.stream);
}

Status CudaExecutor::enqueue_zero(const BucketCall& call, int device, const Launches& launches) {
  const TensorSet& set = *call.set;
  void* stream = devices_.at(device).stream;
  for (uint32_t c : set.participants[call.bucket]) {
    if (device_of_client(set, call.bucket, c) != device) continue;
    if (launches.scatter_only >= 0 && c != static_cast<uint32_t>(launches.scatter_only)) continue;
    for (uint32_t t : set.plan.buckets[call.bucket].tensors) {
      const size_t bytes = set.layout[t].numel * dtype_size(set.layout[t].dtype);
      if (bytes == 0) continue;
      if (Status s = api_->zero(device, set.address[c][t], bytes, stream); !s.ok()) return on_device(device, s);
    }
  }
  return Status();
}

Status CudaExecutor::wire_buffer(int device, size_t bytes) {
  Device& state = devices_.at(device);
  if (state.wire_bytes >= bytes) return Status();
  // In the stream's order, as the bucket buffer: buckets queued before still use the old one.
  for (auto it = tables_.begin(); it != tables_.end();) {
    if (std::get<2>(it->first) == Side::kWire && it->second.first == device) {
      (void)api_->free(device, it->second.second.segments, state.stream);
      (void)api_->free(device, it->second.second.items, state.stream);
      it = tables_.erase(it);
    } else {
      ++it;
    }
  }
  if (state.wire_buffer) (void)api_->free(device, state.wire_buffer, state.stream);
  state.wire_buffer = nullptr;
  state.wire_bytes = 0;
  if (Status s = api_->allocate(device, bytes, state.stream, &state.wire_buffer); !s.ok()) return on_device(device, s);
  state.wire_bytes = bytes;
  return Status();
}

Status CudaExecutor::enqueue_wire(const BucketCall& call, DType wire, bool narrow,
                                  std::span<const DeviceBuffer> buffers) {
  // The half type's own arithmetic with one "client" and no scaling: its scatter stores each
  // float32 sum rounded to it (ScatterItem), its gather loads each back as float32 (GatherItem).
  const reduce::KernelArgs args{.dtype = wire};
  for (const DeviceBuffer& buffer : buffers) {
    const Table* t = nullptr;
    Status status = api_->make_current(buffer.device);
    if (status.ok()) status = table(call, buffer.device, Side::kWire, -1, false, false, &t);
    if (!status.ok()) return status;
    const BucketTable bucket_table{static_cast<const Segment*>(t->segments), static_cast<const WorkItem*>(t->items),
                                   t->item_count, t->clients, buffer.data};
    status = narrow ? kernels_->scatter(args, bucket_table, buffer.stream)
                    : kernels_->gather(args, bucket_table, buffer.stream);
    if (!status.ok()) return status;
  }
  return Status();
}

Status CudaExecutor::enqueue_gather_from(const BucketCall& call, int device, int source_local) {
  const Table* t = nullptr;
  if (Status s = table(call, device, Side::kGather, source_local, false, true, &t); !s.ok() || t->clients == 0) return s;
  Device& state = devices_.at(device);
  return kernels_->gather(reduce::KernelArgs{.dtype = DType::kUInt8},
                          BucketTable{static_cast<const Segment*>(t->segments), static_cast<const WorkItem*>(t->items),
                                      t->item_count, t->clients, state.bucket_buffer},
                          state.stream);
}

Status CudaExecutor::enqueue_scatter_gathered(const BucketCall& call, int device, int source_rank) {
  const Table* t = nullptr;
  if (Status s = table(call, device, Side::kScatterGathered, source_rank, false, true, &t); !s.ok() || t->clients == 0) {
    return s;
  }
  Device& state = devices_.at(device);
  return kernels_->scatter(reduce::KernelArgs{.dtype = DType::kUInt8},
                           BucketTable{static_cast<const Segment*>(t->segments), static_cast<const WorkItem*>(t->items),
                                       t->item_count, t->clients, state.bucket_buffer},
                           state.stream);
}

Status CudaExecutor::enqueue_health(const BucketCall& call, int device, const HealthTableState** state) {
  if (Status s = health_table(call, device, state); !s.ok()) return s;
  return kernels_->health(call.set->plan.buckets[call.bucket].dtype, (*state)->table(), devices_.at(device).stream);
}

Status CudaExecutor::health_table(const BucketCall& call, int device, const HealthTableState** state) {
  const TensorSet& set = *call.set;
  void* stream = devices_.at(device).stream;
  const auto key = std::make_tuple(set.id, call.bucket, device);
  auto it = health_tables_.find(key);
  if (it == health_tables_.end()) {
    // Every participant of an allreduce holds the same result: the first on this GPU is read.
    int reader = -1;
    for (uint32_t c : set.participants[call.bucket]) {
      if (device_of_client(set, call.bucket, c) == device) {
        reader = static_cast<int>(c);
        break;
      }
    }
    if (reader < 0) return Status::internal("no participant of the bucket on GPU " + std::to_string(device));
    HealthTableState made;
    if (Status s = make_health_table(api_, set, call.bucket, device, static_cast<uint32_t>(reader), stream, &made);
        !s.ok()) {
      return on_device(device, s);
    }
    it = health_tables_.emplace(key, std::move(made)).first;
  }
  *state = &it->second;
  return Status();
}

Status CudaExecutor::run_single(const BucketCall& call) {
  const TensorSet& set = *call.set;
  const size_t b = call.bucket;
  const std::string where = "bucket " + std::to_string(b) + " of " + set.name();
  if (Status s = outputs_registered(call, where); !s.ok()) return s;
  int device = -1;
  if (Status s = device_of(set, b, &device); !s.ok()) return s;
  const DType dtype = set.plan.buckets[b].dtype;
  // broadcast and allgather move bytes, not values
  const bool copy = call.desc.kind == OpKind::kBroadcast || call.desc.kind == OpKind::kAllgather;
  const size_t acc = copy ? dtype_size(dtype) : dtype_size(reduce::accumulation_dtype(dtype));
  // Kernels launch on the device's stream from this thread.
  if (Status s = api_->make_current(device); !s.ok()) return on_device(device, s);
  Device* state = nullptr;
  if (Status s = device_state(device, std::max<size_t>(1, set.bucket_elements[b] * acc), &state); !s.ok()) return s;
  // Device-ordered buckets are answered at enqueue: bound how many wait on the GPU.
  if (Status s = retire(device, answer_at_enqueue(call)); !s.ok()) {
    return Status(s.code(), where + ": " + s.message(), s.where());
  }

  const int root = static_cast<int>(call.desc.root % call.topology->local_world_size);
  Launches launches;
  switch (call.desc.kind) {
    case OpKind::kAllreduce: break;
    case OpKind::kReduce: launches.scatter_only = root; break;
    case OpKind::kBroadcast:
      launches.only = root;
      launches.bytes = true;
      launches.scatter_skips_root = true;
      break;
    case OpKind::kAllgather: break;
    case OpKind::kReduceScatter: launches.scatter_shards = true; break;
  }
  // A broadcast moves the root's bytes through the bucket buffer unchanged: as uint8, one
  // "client" in, a copy out, so even NaN payloads of the half types survive.
  reduce::KernelArgs args = call.args;
  if (copy) args = reduce::KernelArgs{.dtype = DType::kUInt8};
  // The health table before anything of the bucket is queued, as the others (table()).
  const HealthTableState* health = nullptr;
  Status status = call.health ? health_table(call, device, &health) : Status();
  if (status.ok()) status = wait_ready(call, device);
  if (call.desc.kind == OpKind::kAllgather) {
    // Source by source through the one bucket buffer; the stream keeps them in order.
    for (uint32_t source : set.participants[b]) {
      if (status.ok()) status = enqueue_gather_from(call, device, static_cast<int>(source));
      if (status.ok()) {
        status = enqueue_scatter_gathered(call, device, call.topology->rank_of(static_cast<int>(source)));
      }
    }
  } else {
    if (status.ok()) status = enqueue(call, device, Side::kGather, launches, args);
    // Whatever happens next, the gather may be running: it is waited for below.
    if (status.ok()) status = enqueue(call, device, Side::kScatter, launches, args);
  }
  if (status.ok() && call.health) status = enqueue_health(call, device, &health);
  if (status.ok()) status = record_done(call, device);
  status = on_device(device, status);
  // Device-ordered: the clients' streams wait on the done events, and quiesce() drains the
  // stream before a failed job lets go of client memory. The bucket joins the device's queue,
  // holding its set, so a stream that stops moving is noticed within the execution bound.
  if (answer_at_enqueue(call)) {
    void* event = nullptr;
    if (status.ok()) status = enqueue_answered(call, device, where, nullptr, &event);
    if (!status.ok()) return Status(status.code(), where + " on GPU " + std::to_string(device) + ": " + status.message());
    return Status();
  }
  // Otherwise nothing that was enqueued may still touch client memory once the answer is out.
  const Status synchronized = on_device(device, api_->synchronize(device, state->stream));
  if (status.ok()) status = synchronized;
  if (status.ok() && health) status = on_device(device, collect_health(api_, device, state->stream, *health, call.health.get()));
  if (!status.ok()) return Status(status.code(), where + " on GPU " + std::to_string(device) + ": " + status.message());
  return Status();
}

void CudaExecutor::run_across(const BucketCall& call, DeviceCollectiveEngine* engine, BucketDone done) {
  const TensorSet& set = *call.set;
  const size_t b = call.bucket;
  const std::string where = std::string(kind_name(call.desc.kind)) + " bucket " + std::to_string(b) + " of " + set.name();
  if (Status s = outputs_registered(call, where); !s.ok()) return done(s);
  const AcrossPlanner& planner = across_planner(call.desc.kind);
  const Topology& topology = *call.topology;
  AcrossBucket bucket;
  bucket.call = &call;
  bucket.engine = engine;
  bucket.dtype = set.plan.buckets[b].dtype;
  // A masked reduction carries the kept elements only (the compact buffer); moves carry all.
  const bool masked = set.masked() && (call.desc.kind == OpKind::kAllreduce || call.desc.kind == OpKind::kReduce);
  bucket.count = masked ? set.reduced_elements(b) : set.bucket_elements[b];
  bucket.bytes = planner.buffer_elements(bucket) * (planner.moves_bytes() ? dtype_size(bucket.dtype)
                                                       : dtype_size(reduce::accumulation_dtype(bucket.dtype)));
  bucket.args = planner.moves_bytes() ? reduce::KernelArgs{.dtype = DType::kUInt8} : call.args;
  bucket.root_node = call.desc.root / topology.local_world_size;
  bucket.root_local = call.desc.root % topology.local_world_size;
  bucket.root_here = bucket.root_node == topology.node;
  bucket.root_gpu = bucket.root_here ? device_of_client(set, b, static_cast<uint32_t>(bucket.root_local)) : -1;
  bucket.root_rank = engine->rank_of(bucket.root_node, bucket.root_local);
  if (planner.has_root() && bucket.root_rank < 0) {
    return done(Status::internal(where + ": root rank " + std::to_string(call.desc.root) + " has no GPU in the group"));
  }

  // The executor's steps a collective interleaves (a local class: it reaches the executor's
  // private members as run_across does).
  struct Steps final : AcrossSteps {
    CudaExecutor& executor;
    const BucketCall& call;
    Steps(CudaExecutor& e, const BucketCall& c) : executor(e), call(c) {}
    Status make_current(int device) override { return executor.api_->make_current(device); }
    Status gather_from(int device, int source_local) override {
      return executor.enqueue_gather_from(call, device, source_local);
    }
    Status scatter_gathered(int device, int source_rank) override {
      return executor.enqueue_scatter_gathered(call, device, source_rank);
    }
    int device_of_client(uint32_t local_rank) const override {
      return CudaExecutor::device_of_client(*call.set, call.bucket, local_rank);
    }
  } steps(*this, call);

  // Wire compression, as on the host: only where the group spans nodes (check_op admits it for
  // allreduce and reduce of float32, float16 and bfloat16 sets).
  if (call.desc.wire != DType::kFloat32 && topology.nodes_of(set.plan.buckets[b].group).size() > 1) {
    // Only these planners hand NCCL the wire type (check_op refuses the others first).
    if (call.desc.kind != OpKind::kAllreduce && call.desc.kind != OpKind::kReduce) {
      return done(Status::not_supported(where + ": wire compression of a device " + kind_name(call.desc.kind) +
                                        " is not offered"));
    }
    bucket.wire = call.desc.wire;
  }
  const bool ordered = answer_at_enqueue(call);
  std::vector<DeviceBuffer> buffers;
  Status status = ready_devices(*engine, bucket.bytes, ordered, &buffers);
  // Zero-copy: NCCL in the clients' own flat runs; the kernels only scale, in place.
  std::vector<void*> runs;
  bucket.direct = status.ok() && planner.zero_copy() && !bucket.wire && zero_copy(call, engine->devices(), &runs);
  if (bucket.direct) {
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].data = runs[i];
  }
  // Every table this bucket uses on this node, before anything of it is queued: a table's
  // first upload, from pageable memory, may wait for the work already on the stream, and once
  // the collective is queued that would be the collective (peers included).
  for (size_t i = 0; i < buffers.size() && status.ok(); ++i) {
    const Table* t = nullptr;
    for (const TableRequest& r : planner.tables(bucket, buffers[i].device, steps)) {
      if (status.ok()) status = table(call, buffers[i].device, r.side, r.only, r.skip_root, r.bytes, &t);
    }
    if (status.ok() && bucket.wire) status = wire_buffer(buffers[i].device, std::max<size_t>(1, bucket.count) * 2);
    if (status.ok() && bucket.wire) status = table(call, buffers[i].device, Side::kWire, -1, false, false, &t);
    if (status.ok() && call.health && buffers[i].device == health_device(call, buffers)) {
      const HealthTableState* made = nullptr;
      status = health_table(call, buffers[i].device, &made);
    }
  }
  for (size_t i = 0; i < buffers.size() && status.ok(); ++i) {
    const int device = buffers[i].device;
    status = api_->make_current(device);
    if (status.ok()) status = wait_ready(call, device);
    if (status.ok()) {
      status = enqueue(call, device, Side::kGather, planner.launches(bucket, device), bucket.args,
                       bucket.direct ? buffers[i].data : nullptr);
    }
  }
  if (status.ok() && bucket.wire) {
    status = enqueue_wire(call, *bucket.wire, true, buffers);
    std::vector<DeviceBuffer> carried = buffers;
    for (DeviceBuffer& buffer : carried) buffer.data = devices_.at(buffer.device).wire_buffer;
    if (status.ok()) status = planner.collective(bucket, carried, steps);
    // Widened only where a scatter reads it (a reduce's root GPU; every GPU of an allreduce).
    std::vector<DeviceBuffer> read;
    for (const DeviceBuffer& buffer : buffers) {
      if (planner.launches(bucket, buffer.device).scatter) read.push_back(buffer);
    }
    if (status.ok()) status = enqueue_wire(call, *bucket.wire, false, read);
  } else if (status.ok()) {
    status = planner.collective(bucket, buffers, steps);
  }
  auto watched = ordered ? std::make_shared<std::atomic<int>>(kWatching) : nullptr;
  std::vector<std::pair<int, void*>> events;  // (device, event after the bucket)
  const HealthTableState* health = nullptr;
  if (status.ok()) status = finish_across(call, planner, bucket, buffers, where, watched, &events, &health);
  if (!status.ok()) {
    // A sticky error first seen in a launch or inside NCCL: the GPU's health says so.
    for (const DeviceBuffer& buffer : buffers) {
      if (Status broken = broken_gpu(api_, gpus_, buffer.device); !broken.ok()) {
        status = broken;
        break;
      }
    }
    // This rank will not do its part: abort the engine, whether or not its collective was
    // enqueued (the peers' collectives fail fast instead of at their timeout, and one enqueued
    // here returns), then drain before answering.
    const Status error(status.code(), where + ": " + status.message(), status.where());
    if (watched) watched->store(kFailed);  // nobody watches what was queued of it
    engine->abort(error);
    // Device-ordered: the failing job's drain (quiesce(), bounded) deals with the streams.
    // Others hold only our kernels and NCCL's aborted ones, so they drain.
    if (!ordered) {
      for (const DeviceBuffer& buffer : buffers) (void)api_->synchronize(buffer.device, buffer.stream);
    }
    return done(error);
  }
  if (health) {
    // Answered once the GPUs are through (never at enqueue), with the health read back first.
    const int device = health_device(call, buffers);
    done = [done = std::move(done), api = api_, device, stream = devices_.at(device).stream, table = *health,
            blocks = call.health](const Status& answer) {
      done(answer.ok() ? collect_health(api, device, stream, table, blocks.get()) : answer);
    };
  }
  watch_across(*engine, where, std::move(watched), std::move(events), buffers, std::move(done));
}

int CudaExecutor::health_device(const BucketCall& call, std::span<const DeviceBuffer> buffers) {
  // The first of this node's GPUs with a participant (each of an allreduce's holds the result).
  for (const DeviceBuffer& buffer : buffers) {
    for (uint32_t c : call.set->participants[call.bucket]) {
      if (device_of_client(*call.set, call.bucket, c) == buffer.device) return buffer.device;
    }
  }
  return buffers.empty() ? -1 : buffers.front().device;
}

Status CudaExecutor::ready_devices(DeviceCollectiveEngine& engine, size_t bytes, bool ordered,
                                   std::vector<DeviceBuffer>* buffers) {
  // Every local GPU: its stream and bucket buffer, and room in its queue when the bucket will
  // be answered at enqueue.
  for (int device : engine.devices()) {
    Device* state = nullptr;
    Status status = on_device(device, api_->make_current(device));
    if (status.ok()) status = device_state(device, std::max<size_t>(1, bytes), &state);
    if (status.ok() && !ordered && !state->done_event) status = api_->create_event(device, &state->done_event);
    if (status.ok() && ordered) status = retire(device, true);
    if (!status.ok()) return on_device(device, status);
    buffers->push_back(DeviceBuffer{device, state->bucket_buffer, state->stream});
  }
  return Status();
}

Status CudaExecutor::finish_across(const BucketCall& call, const AcrossPlanner& planner, const AcrossBucket& bucket,
                                   std::span<const DeviceBuffer> buffers, const std::string& where,
                                   const std::shared_ptr<std::atomic<int>>& watched,
                                   std::vector<std::pair<int, void*>>* events, const HealthTableState** health) {
  // After the collective: the scatter, the health kernel (on one GPU), the clients' done
  // events, and this executor's own event per GPU, which the watchdog follows.
  const bool ordered = watched != nullptr;
  const int health_on = call.health ? health_device(call, buffers) : -1;
  Status status;
  for (size_t i = 0; i < buffers.size() && status.ok(); ++i) {
    const int device = buffers[i].device;
    status = api_->make_current(device);
    if (status.ok()) {
      status = enqueue(call, device, Side::kScatter, planner.launches(bucket, device), bucket.args,
                       bucket.direct ? buffers[i].data : nullptr);
    }
    if (status.ok() && device == health_on) status = enqueue_health(call, device, health);
    if (status.ok()) status = record_done(call, device);
    void* event = devices_.at(device).done_event;
    if (status.ok() && ordered) status = enqueue_answered(call, device, where, watched, &event);
    if (status.ok() && !ordered) status = api_->record_event(device, event, buffers[i].stream);
    if (status.ok()) events->emplace_back(device, event);
    status = on_device(device, status);
  }
  return status;
}

void CudaExecutor::watch_across(DeviceCollectiveEngine& engine, const std::string& where,
                                std::shared_ptr<std::atomic<int>> watched, std::vector<std::pair<int, void*>> events,
                                std::span<const DeviceBuffer> buffers, BucketDone done) {
  DeviceApi* api = api_;
  GpuWatch* gpus = gpus_;
  // A query that fails with a sticky error names the broken GPU (and reports it) rather than
  // the raw CUDA error.
  auto poll = [api, gpus, events](bool* finished) {
    for (const auto& [device, event] : events) {
      Status s = api->query_event(device, event, finished);
      if (!s.ok()) {
        const Status broken = broken_gpu(api, gpus, device);
        return broken.ok() ? s : broken;
      }
      if (!*finished) return s;
    }
    return Status();
  };
  if (watched) {
    // Answered now: the clients' streams wait on the done events, and up to kMaxQueued buckets
    // per GPU are in flight. The watchdog follows each one; a failure fails the job from its
    // thread (after aborting the communicators), and the worker's drain bounds the rest.
    std::vector<int> devices;
    for (const auto& [device, event] : events) devices.push_back(device);
    engine.watch(where, std::move(poll), watch_timeout_,
                 [watched, fail = fail_job_, api, gpus, devices](const Status& answer) {
                   watched->store(answer.ok() ? kThrough : kFailed);
                   if (answer.ok()) return;
                   // An NCCL error may be a sticky CUDA error underneath: then the GPU is
                   // reported, and every job on it fails with that.
                   for (int device : devices) {
                     if (Status broken = broken_gpu(api, gpus, device); !broken.ok()) {
                       if (fail) fail(broken);
                       return;
                     }
                   }
                   if (fail) fail(answer);
                 });
    return done(Status());
  }
  std::vector<std::pair<int, void*>> streams;  // (device, stream)
  for (const DeviceBuffer& buffer : buffers) streams.emplace_back(buffer.device, buffer.stream);
  engine.watch(where, std::move(poll), watch_timeout_,
               [api, streams, done = std::move(done)](const Status& answer) {
                 // The communicators were aborted before an error is answered, so the streams
                 // drain.
                 if (!answer.ok()) {
                   for (const auto& [device, stream] : streams) (void)api->synchronize(device, stream);
                 }
                 done(answer);
               });
}

}  // namespace gradsync::cuda
