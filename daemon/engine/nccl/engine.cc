#include "daemon/engine/nccl/engine.h"

#include <algorithm>
#include <optional>

#include "daemon/reduce/staged.h"  // reduce::accumulation_dtype
#include "shared/backoff.h"

namespace gradsync::nccl {
namespace {

const void* input_of(const DeviceBuffer& buffer) { return buffer.source ? buffer.source : buffer.data; }

}  // namespace

NcclEngine::NcclEngine(NcclApi* api, DeviceEngineSpec spec, EngineTiming timing, CommPark* park)
    : api_(api), spec_(std::move(spec)), timing_(timing), park_(park) {
  // A parent made by another factory (a test's fake) cannot be split: fresh communicators then.
  parent_ = dynamic_cast<NcclEngine*>(spec_.parent);
  family_ = parent_ ? parent_->family_ : std::make_shared<Family>();
}

NcclEngine::~NcclEngine() {
  std::unique_ptr<Watchdog> watchdog;
  {
    MutexLock lock(status_mutex_);
    watchdog = std::move(watchdog_);
  }
  watchdog.reset();  // fails what is in flight, aborting the communicators first
  MutexLock lock(family_->calls);
  if (!park_locked()) abort_locked();
}

std::string NcclEngine::park_key() const {
  std::string key = spec_.reuse_key + "|gpus";
  for (int d : spec_.devices) key += " " + std::to_string(d);
  key += "|slots";
  for (int s : spec_.slot_of_local_rank) key += " " + std::to_string(s);
  return key;
}

bool NcclEngine::park_locked() {
  if (!park_ || !park_->enabled() || spec_.reuse_key.empty() || comms_aborted_ || comms_.empty() || !idle() ||
      in_family_.load()) {
    return false;
  }
  for (void* comm : comms_) {
    Status error;
    if (!comm || api_->state(comm, &error) != CommState::kReady) return false;
  }
  // The registrations are of this job's memory, which is unmapped once the job's sets go.
  for (auto& [key, handle] : registered_) {
    if (!handle) continue;  // NCCL did not register it
    const auto at = std::find(spec_.devices.begin(), spec_.devices.end(), key.first) - spec_.devices.begin();
    if (!api_->deregister_buffer(comms_[static_cast<size_t>(at)], handle).ok()) return false;
  }
  registered_.clear();
  park_->park_locked(ParkedComms{park_key(), plan_, id_, issued_.load(), comms_, {}});
  comms_.clear();
  comms_aborted_ = true;  // no longer this engine's
  return true;
}

Status NcclEngine::try_reuse(Rendezvous* rendezvous, bool* reused) {
  *reused = false;
  std::optional<ParkedComms> kept;
  if (park_ && !spec_.devices.empty()) kept = park_->take(park_key());
  bool usable = kept && kept->plan == plan_ && !stop_.load();
  if (usable) {
    // A peer's abort or a network error may have reached them while they were kept.
    MutexLock lock(family_->calls);
    for (void* comm : kept->comms) {
      Status error;
      if (api_->state(comm, &error) != CommState::kReady) usable = false;
    }
  }
  if (kept && !usable) {
    park_->discard(std::move(*kept));
    kept.reset();
  }
  const std::string offer = spec_.devices.empty() ? "" : kept ? reuse_offer(kept->id, kept->collectives) : "fresh";
  bool agreed = false;
  const Status status = agree_reuse(rendezvous, spec_.name, offer, &agreed);
  if (!status.ok() || !agreed || stop_.load()) {
    if (kept) park_->discard(std::move(*kept));
    if (stop_.load()) return unusable();  // aborted: no unique id (and NCCL bootstrap root) is made
    return status;
  }
  if (kept) {
    MutexLock lock(family_->calls);
    comms_ = std::move(kept->comms);
    id_ = kept->id;
    issued_.store(kept->collectives);
    completed_.store(kept->collectives);
  }
  *reused = true;
  return Status();
}

std::string NcclEngine::describe(size_t local) const {
  const int rank = plan_.base.empty() ? -1 : plan_.base[static_cast<size_t>(plan_.node)] + static_cast<int>(local);
  return "GPU " + std::to_string(spec_.devices[local]) + " (rank " + std::to_string(rank) + " of " +
         std::to_string(plan_.ranks) + ")";
}

Status NcclEngine::unusable() const {
  MutexLock lock(status_mutex_);
  if (!aborted_.ok()) return aborted_;
  if (watchdog_) return watchdog_->failure();
  return Status();
}

void NcclEngine::abort(const Status& why) {
  MutexLock lock(status_mutex_);
  if (aborted_.ok()) {
    aborted_ = why.ok() ? Status::aborted("aborted") : why;
    stop_.store(true);
  }
  // Without a watchdog, connect() is running or never ran: it sees stop_ and aborts itself.
  // Communicators that span other nodes are aborted even when idle: a peer may be inside a
  // collective this node will never issue, and the abort is how NCCL tells it at once. Idle
  // ones on this node alone are left as they are, to be kept for the job's next generation
  // when the engine goes; a collective issued after this is answered through watch(), which
  // aborts then.
  // A split family is never kept (its members share one abort flag): aborted like work in flight.
  if (watchdog_ && (!idle() || spans_nodes() || in_family_.load())) watchdog_->abort(aborted_);
}

void NcclEngine::abandon() {
  std::unique_ptr<Watchdog> watchdog;
  {
    MutexLock lock(status_mutex_);
    watchdog = std::move(watchdog_);
    if (aborted_.ok()) aborted_ = Status::aborted(spec_.what + ": abandoned");
    stop_.store(true);
  }
  watchdog.reset();  // nothing in flight: it stops without aborting anything
  MutexLock lock(family_->calls);
  // With no collective of ours queued, the GPUs use nothing of NCCL's: free it. Otherwise a
  // queued collective may still run once its stream moves, so it is never touched again.
  if (idle()) {
    abort_locked();
  } else {
    comms_aborted_ = true;
  }
}

void NcclEngine::abort_locked() {
  if (comms_aborted_) return;
  comms_aborted_ = true;
  for (void* comm : comms_) {
    if (!comm) continue;
    api_->abort(comm);
    family_->aborted = true;  // NCCL's abort flag is the family's: tell the other members
  }
  registered_.clear();  // the abort freed the registrations with the communicators
}

Status NcclEngine::family_aborted_locked() const {
  if (!family_->aborted) return Status();
  return Status::aborted(spec_.what + ": a communicator sharing its resources (split off the same parent) was aborted");
}

Status NcclEngine::wait_ready(const std::string& what, std::chrono::milliseconds timeout,
                              std::chrono::microseconds poll, const std::atomic<bool>* also_stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A group call NCCL left in progress is usually enqueued within microseconds: spin, yield,
  // then sleep up to `poll` (communicator creation polls every 10 ms, as PyTorch does).
  Backoff backoff({.max_sleep = poll});
  for (;;) {
    bool pending = false;
    bool aborted = false;
    {
      MutexLock lock(family_->calls);
      if (Status family = family_aborted_locked(); !family.ok() && !comms_aborted_) {
        return Status(family.code(), what + ": " + family.message());
      }
      aborted = comms_aborted_;
      for (size_t i = 0; i < comms_.size() && !aborted; ++i) {
        if (!comms_[i]) continue;
        Status error;
        switch (api_->state(comms_[i], &error)) {
          case CommState::kReady: break;
          case CommState::kInProgress: pending = true; break;
          case CommState::kFailed:
            return Status(error.code(), what + " on " + describe(i) + ": " + error.message(), error.where());
        }
      }
    }
    if (aborted) {
      // Most likely by the watchdog, which then knows why (outside calls_: status_mutex_ first).
      const Status why = unusable();
      if (why.ok()) return Status::aborted(what + ": the communicators were aborted");
      return Status(why.code(), what + ": the communicators were aborted: " + why.message(), why.where());
    }
    if (!pending) return Status();
    if (stop_.load() || (also_stop && also_stop->load())) return Status::aborted(what + " was aborted");
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::timeout(what + " did not finish within " + std::to_string(timeout.count()) + " ms");
    }
    backoff.pause();
  }
}

Status NcclEngine::connect(Rendezvous* rendezvous) {
  if (Status status = unusable(); !status.ok()) return status;
  const auto failed = [&](const Status& status) {
    if (stop_.load()) return unusable();  // this node gave up on purpose: that is the answer
    return Status(status.code(), spec_.what + ": " + status.message(), status.where());
  };
  // Every node, whether or not it makes the id, so that one without NCCL fails here, cleanly.
  if (Status status = api_->load(); !status.ok()) return failed(status);
  if (Status status = plan_ranks(rendezvous, spec_.name, static_cast<int>(spec_.devices.size()),
                                 spec_.slot_of_local_rank, &plan_);
      !status.ok()) {
    return failed(status);
  }
  // One GPU in all: the executor's kernels do it alone.
  if (plan_.ranks == 0 || (plan_.ranks == 1 && !spec_.single_rank_communicator)) return Status();
  bool reuse = false;
  if (!spec_.reuse_key.empty()) {
    if (Status status = try_reuse(rendezvous, &reuse); !status.ok()) return failed(status);
  }
  bool split = false;
  // One deadline for the whole split, the child's own readiness included.
  const auto deadline = std::chrono::steady_clock::now() + spec_.timeout;
  if (!reuse && parent_) {
    // Every node agreed on this parent: each splits its ranks of it, with or without GPUs here.
    if (Status status = split_from_parent(deadline); !status.ok()) return failed(status);
    if (spec_.devices.empty()) {
      connected_.store(true);
      return Status();
    }
    split = true;
    split_ = true;
  }
  UniqueId& id = id_;
  if (!reuse && !split) {
    if (Status status = agree_unique_id(
            rendezvous, spec_.name, plan_,
            [this](UniqueId* out) {
              if (stop_.load()) return unusable();
              MutexLock lock(family_->calls);
              return api_->unique_id(out);
            },
            &id);
        !status.ok()) {
      return failed(status);
    }
  }
  if (spec_.devices.empty()) {  // this node brings no GPU to the group
    connected_.store(true);
    return Status();
  }
  reused_ = reuse;
  Status status;
  if (!reuse && !split) {
    MutexLock lock(family_->calls);
    if (stop_.load()) return unusable();
    comms_.assign(spec_.devices.size(), nullptr);
    // Every local rank inside one group: NCCL needs them all to make progress at once.
    status = api_->group_start();
    const int base = plan_.base[static_cast<size_t>(plan_.node)];
    for (size_t i = 0; i < comms_.size() && status.ok(); ++i) {
      status = api_->init_rank(spec_.devices[i], plan_.ranks, id, base + static_cast<int>(i), &comms_[i]);
    }
    const Status ended = api_->group_end();
    if (status.ok()) status = ended;
  }
  const auto left = split ? std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
                          : spec_.timeout;
  if (status.ok()) {
    status = wait_ready("creating the NCCL communicators", std::max(left, std::chrono::milliseconds(1)),
                        timing_.init_poll);
  }
  if (!status.ok()) {
    MutexLock lock(family_->calls);
    abort_locked();
  }
  if (!status.ok()) return failed(status);
  MutexLock lock(status_mutex_);
  if (!aborted_.ok()) {  // aborted between the last poll and now: nothing was issued
    MutexLock calls_lock(family_->calls);
    if (spans_nodes() || !park_locked()) abort_locked();
    return aborted_;
  }
  WatchedComms* comms = this;
  watchdog_ = std::make_unique<Watchdog>(comms, timing_.watchdog_poll, timing_.completion_poll);
  connected_.store(true);
  return Status();
}

bool NcclEngine::splittable() const {
  if (!connected_.load() || !unusable().ok() || stop_.load()) return false;
  MutexLock lock(family_->calls);
  // A node without GPUs in the group has no communicator, but takes part all the same.
  return !comms_aborted_ && (plan_.ranks > 1 || !comms_.empty());
}

Status NcclEngine::split_from_parent(std::chrono::steady_clock::time_point deadline) {
  // NCCL writes each child into `made` when the split completes, on its own thread. After a
  // failure it may still be doing so until the parent is aborted; the slots are then left
  // alive on purpose (a few bytes).
  auto made = std::make_unique<std::vector<void*>>();
  const Status status = parent_->split_for(*this, deadline, made.get());
  if (!status.ok()) {
    // NCCL's advice after a failed split: abort the parent (which ends the split), then
    // whatever it made. The parent's watchdog then fails the parent's own work in flight.
    {
      MutexLock lock(family_->calls);
      parent_->abort_locked();
    }
    parent_->abort(Status(status.code(), parent_->spec_.what + ": " + status.message(), status.where()));
  }
  MutexLock lock(family_->calls);
  in_family_.store(true);  // the calls share the parent's resources, and its abort flag
  comms_.assign(spec_.devices.size(), nullptr);
  std::vector<void*> strays;  // made for a GPU that is not this engine's: cannot happen, but is NCCL's
  for (size_t i = 0; i < made->size(); ++i) {
    if (!(*made)[i]) continue;
    const int device = parent_->spec_.devices[i];
    const auto at = std::find(spec_.devices.begin(), spec_.devices.end(), device) - spec_.devices.begin();
    if (static_cast<size_t>(at) < comms_.size()) {
      comms_[static_cast<size_t>(at)] = (*made)[i];
    } else {
      strays.push_back((*made)[i]);
    }
  }
  for (void* comm : strays) api_->abort(comm);
  if (!status.ok()) {
    abort_locked();
    (void)made.release();
    return status;
  }
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (!comms_[i]) {
      abort_locked();
      return Status::internal("NCCL's split made no communicator for " + describe(i));
    }
  }
  return Status();
}

Status NcclEngine::split_for(const NcclEngine& child, std::chrono::steady_clock::time_point deadline,
                             std::vector<void*>* made) {
  const std::string what = "splitting " + child.spec_.what + " off " + spec_.what;
  made->assign(comms_.size(), nullptr);
  const int base = child.plan_.base[static_cast<size_t>(child.plan_.node)];
  for (int device : child.spec_.devices) {
    if (std::find(spec_.devices.begin(), spec_.devices.end(), device) == spec_.devices.end()) {
      return Status::internal(what + ": GPU " + std::to_string(device) + " is not one of the parent's");
    }
  }
  Backoff backoff({.max_sleep = timing_.enqueue_poll});
  for (;;) {
    {
      MutexLock lock(family_->calls);
      if (comms_aborted_) return Status::aborted(what + ": the parent's communicators were aborted");
      if (Status family = family_aborted_locked(); !family.ok()) return Status(family.code(), what + ": " + family.message());
      // NCCL refuses to split a communicator that is in progress (a group call still being
      // enqueued): wait for it, then split under the same hold, before another call starts.
      bool ready = true;
      for (size_t i = 0; i < comms_.size() && ready; ++i) {
        Status error;
        switch (api_->state(comms_[i], &error)) {
          case CommState::kReady: break;
          case CommState::kInProgress: ready = false; break;
          case CommState::kFailed:
            return Status(error.code(), what + ": the parent on " + describe(i) + ": " + error.message(),
                          error.where());
        }
      }
      if (ready) {
        in_family_.store(true);
        // Every local rank inside one group: each joins an allgather over the parent's bootstrap.
        Status status = api_->group_start();
        for (size_t i = 0; i < comms_.size() && status.ok(); ++i) {
          const int device = spec_.devices[i];
          const auto at = std::find(child.spec_.devices.begin(), child.spec_.devices.end(), device) -
                          child.spec_.devices.begin();
          const bool member = static_cast<size_t>(at) < child.spec_.devices.size();
          status = api_->split(comms_[i], device, member ? 0 : NcclApi::kNoColor,
                               member ? base + static_cast<int>(at) : 0, &(*made)[i]);
        }
        const Status ended = api_->group_end();
        if (status.ok()) status = ended;
        if (!status.ok()) return Status(status.code(), what + ": " + status.message(), status.where());
        break;
      }
    }
    if (stop_.load() || child.stop_.load()) return Status::aborted(what + " was aborted");
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::timeout(what + ": the parent stayed busy for " + std::to_string(child.spec_.timeout.count()) +
                             " ms");
    }
    backoff.pause();
  }
  // The parent is in progress until NCCL made the child, which it writes into *made then.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return wait_ready(what, std::max(left, std::chrono::milliseconds(1)), timing_.init_poll, &child.stop_);
}

Status NcclEngine::group_call(const std::string& what, std::span<const DeviceBuffer> buffers,
                              const std::function<Status(size_t)>& issue) {
  if (Status status = unusable(); !status.ok()) return status;
  if (comms_.empty()) return Status::internal(spec_.what + ": " + what + " on an engine without communicators");
  if (buffers.size() != comms_.size()) {
    return Status::internal(spec_.what + ": " + what + " got " + std::to_string(buffers.size()) +
                            " buffers for " + std::to_string(comms_.size()) + " local GPUs");
  }
  Status status;
  {
    MutexLock lock(family_->calls);
    if (comms_aborted_) status = Status::aborted("the communicators were aborted");
    if (status.ok()) status = family_aborted_locked();
    if (status.ok()) issued_.fetch_add(1);  // counted before issued: from here on not idle
    if (status.ok()) status = api_->group_start();
    if (status.ok()) {
      for (size_t i = 0; i < comms_.size() && status.ok(); ++i) status = issue(i);
      const Status ended = api_->group_end();
      if (status.ok()) status = ended;
    }
  }
  if (status.ok()) status = wait_ready(what, spec_.enqueue_timeout, timing_.enqueue_poll);
  if (status.ok()) return status;
  if (Status why = unusable(); !why.ok()) return why;
  // An error from a group call leaves every communicator of the group unusable: fail the engine,
  // which aborts them all.
  const Status error(status.code(), spec_.what + ": NCCL " + what + ": " + status.message(), status.where());
  abort(error);
  return error;
}

Status NcclEngine::allreduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& spec) {
  const DType dtype = spec.wire.value_or(reduce::accumulation_dtype(spec.element));  // wire: the half type
  return group_call("allreduce of " + std::to_string(count) + " elements", buffers, [&](size_t i) {
    return api_->all_reduce(input_of(buffers[i]), buffers[i].data, count, dtype, spec.op, comms_[i],
                            buffers[i].stream);
  });
}

Status NcclEngine::broadcast(std::span<const DeviceBuffer> buffers, size_t bytes, int root) {
  if (root < 0 || root >= plan_.ranks) return Status::internal(spec_.what + ": broadcast root " + std::to_string(root));
  return group_call("broadcast of " + std::to_string(bytes) + " bytes", buffers, [&](size_t i) {
    return api_->broadcast(input_of(buffers[i]), buffers[i].data, bytes, DType::kUInt8, root, comms_[i],
                           buffers[i].stream);
  });
}

Status NcclEngine::reduce(std::span<const DeviceBuffer> buffers, size_t count, const ReduceSpec& spec, int root) {
  if (root < 0 || root >= plan_.ranks) return Status::internal(spec_.what + ": reduce root " + std::to_string(root));
  const DType dtype = spec.wire.value_or(reduce::accumulation_dtype(spec.element));  // wire: the half type
  return group_call("reduce of " + std::to_string(count) + " elements", buffers, [&](size_t i) {
    return api_->reduce(input_of(buffers[i]), buffers[i].data, count, dtype, spec.op, root, comms_[i],
                        buffers[i].stream);
  });
}

Status NcclEngine::allgather(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t bytes) {
  if (in.size() != out.size()) return Status::internal(spec_.what + ": allgather with mismatched buffer lists");
  return group_call("allgather of " + std::to_string(bytes) + " bytes per rank", in, [&](size_t i) {
    return api_->all_gather(in[i].data, out[i].data, bytes, DType::kUInt8, comms_[i], in[i].stream);
  });
}

Status NcclEngine::reduce_scatter(std::span<const DeviceBuffer> in, std::span<const DeviceBuffer> out, size_t count,
                                  const ReduceSpec& spec) {
  if (in.size() != out.size()) return Status::internal(spec_.what + ": reduce-scatter with mismatched buffer lists");
  const DType dtype = reduce::accumulation_dtype(spec.element);  // never compressed (check_op)
  return group_call("reduce-scatter of " + std::to_string(count) + " elements per rank", in, [&](size_t i) {
    return api_->reduce_scatter(in[i].data, out[i].data, count, dtype, spec.op, comms_[i], in[i].stream);
  });
}

Status NcclEngine::register_buffer(int device, void* data, size_t bytes, bool* registered) {
  *registered = false;
  if (Status status = unusable(); !status.ok()) return status;
  MutexLock lock(family_->calls);
  if (comms_aborted_) return Status::aborted("the communicators were aborted");
  // A registration lives until deregister_buffer() (the CUDA executor's, once no set of this
  // engine uses the memory and the GPU is through it, before the memory may be unmapped), or
  // until the communicators are parked (undone then) or aborted (NCCL drops them). Its owner
  // keeps the memory mapped meanwhile: no other memory can appear at a registered address.
  if (auto it = registered_.find({device, data}); it != registered_.end()) {
    *registered = it->second != nullptr;
    return Status();
  }
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (spec_.devices[i] != device) continue;
    void* handle = nullptr;
    if (Status status = api_->register_buffer(comms_[i], data, bytes, &handle); !status.ok()) return status;
    // NCCL answers success without a handle where it does not register (NCCL_LOCAL_REGISTER=0,
    // copies through its own buffers; 2.19 without NVLS): not zero-copy, and nothing to undo.
    // Kept either way, so that it is asked once per buffer.
    registered_[{device, data}] = handle;
    *registered = handle != nullptr;
    return Status();
  }
  return Status::internal(spec_.what + ": GPU " + std::to_string(device) + " is not one of this engine's");
}

Status NcclEngine::deregister_buffer(int device, void* data) {
  MutexLock lock(family_->calls);
  auto it = registered_.find({device, data});
  if (it == registered_.end()) return Status();
  void* handle = it->second;
  // Aborted or parked communicators hold no registration any more (NCCL drops them with the
  // communicator; park_locked() undid them): nothing to undo. Nor is NCCL called once a split
  // sibling's abort set the family's shared abort flag: those communicators are being aborted.
  // (Forgetting the handle then is safe because a family abort fails the job: nothing is
  // registered through these communicators again.)
  if (handle && !comms_aborted_ && family_aborted_locked().ok()) {
    const auto at = std::find(spec_.devices.begin(), spec_.devices.end(), device) - spec_.devices.begin();
    if (Status status = api_->deregister_buffer(comms_[static_cast<size_t>(at)], handle); !status.ok()) {
      return Status(status.code(), spec_.what + ": undoing the registration of a buffer on GPU " +
                                       std::to_string(device) + ": " + status.message());
    }
  }
  registered_.erase(it);
  return Status();
}

void NcclEngine::watch(std::string what, std::function<Status(bool* done)> poll, std::chrono::milliseconds timeout,
                       EngineDone done) {
  Watchdog* watchdog = nullptr;
  Status status;
  {
    MutexLock lock(status_mutex_);
    watchdog = watchdog_.get();
    status = aborted_;
  }
  if (!watchdog) return done(status.ok() ? Status::internal(spec_.what + ": watch() on an engine that is not connected")
                                         : status);
  if (!status.ok()) {
    if (idle()) return done(status);
    // Aborted while this collective was being issued: abort the communicators, and answer only
    // after that, as for any work in flight.
    watchdog->abort(status);
  }
  const uint64_t upto = issued_.load();
  watching_.fetch_add(1);
  watchdog->watch(InFlight{spec_.what + ": " + what, std::move(poll),
                           [this, upto, done = std::move(done)](const Status& result) {
                             if (result.ok()) completed_.store(upto);
                             watching_.fetch_sub(1);
                             done(result);
                           },
                           timeout});
}

Status NcclEngine::async_error() {
  MutexLock lock(family_->calls);
  if (comms_aborted_) return Status();  // the watchdog aborted them itself: it knows why
  // Another member's abort cut this engine's work short too (one abort flag in NCCL).
  if (Status family = family_aborted_locked(); !family.ok()) return family;
  for (size_t i = 0; i < comms_.size(); ++i) {
    Status error;
    if (api_->state(comms_[i], &error) == CommState::kFailed) {
      return Status(error.code(), spec_.what + " on " + describe(i) + ": " + error.message(), error.where());
    }
  }
  return Status();
}

void NcclEngine::abort_all() {
  stop_.store(true);  // a group call polling NCCL gives up
  MutexLock lock(family_->calls);
  abort_locked();
}

}  // namespace gradsync::nccl
