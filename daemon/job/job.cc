#include "daemon/job/job.h"

#include <boost/asio/post.hpp>

#include <algorithm>
#include <new>

#include "daemon/job/peer_cluster.h"
#include "daemon/plan/layout.h"
#include "daemon/util/safe_text.h"
#include "shared/channel_layout.h"

namespace gradsync {

namespace {
// What the admin service shows of a job's failure (GetStatus, gradsyncctl status).
constexpr size_t kMaxLastErrorBytes = 2048;
}  // namespace

Job::Job(JobOptions options)
    : options_(std::move(options)),
      log_(options_.services.log.with("job=" + options_.params.id + " uid=" + std::to_string(options_.params.uid))),
      doorbell_(options_.doorbell ? std::move(options_.doorbell) : std::make_shared<JobDoorbell>()),
      members_(static_cast<size_t>(options_.params.local_world_size)) {
  WorkerOptions worker;
  worker.job_id = options_.params.id;
  worker.owner_job = store_job();
  worker.topology = options_.params.topology;
  if (worker.topology.nodes > 1) {
    ClusterOptions cluster;
    cluster.job_id = options_.params.id;
    cluster.store_job = store_job();
    cluster.topology = worker.topology;
    cluster.timeout = options_.params.timeout;
    cluster.rendezvous = options_.params.rendezvous;
    cluster.store = options_.store;
    cluster.advertise = options_.services.cluster.advertise;
    cluster.engines = options_.services.cluster.engines;
    cluster.auth = options_.services.cluster.auth;
    cluster.log = log_;
    worker.cluster = std::make_unique<PeerCluster>(std::move(cluster));
  }
  worker.timeout = options_.params.timeout;
  worker.execution_timeout = options_.services.execution.timeout;
  worker.backends = options_.services.execution.backends;
  worker.integrity = options_.services.execution.integrity;
  // A failure the worker finds itself (a timeout, a bad ring entry, a lost node) also ends the
  // job's control side, on the io thread: pending registrations fail and client memory is
  // released now rather than when the clients leave.
  // `alive_` is read and cleared only on the io thread, so the posted call cannot outlive the job.
  worker.on_stopped = [io = options_.services.io, alive = alive_](const Status& status) {
    boost::asio::post(*io, [alive, status] {
      if (*alive) (*alive)->fail(status);
    });
  };
  worker.doorbell = doorbell_;
  worker.pool = options_.services.pool;
  worker.log = log_;
  worker_ = std::make_shared<Worker>(std::move(worker));
  if (options_.services.progress && params().topology.nodes > 1) {
    options_.services.progress->add(store_job(), worker_,
                           ProgressBoard::Shape{params().topology.nodes, params().topology.node, params().rendezvous});
  }
  log_.info("formed (incarnation " + std::to_string(options_.incarnation) + ", world size " +
            std::to_string(options_.params.world_size) + ", node " + std::to_string(params().topology.node) + " of " +
            std::to_string(params().topology.nodes) + ", timeout " +
            std::to_string(options_.params.timeout.count()) + " ms)");
}

void Job::retire() {
  if (retired_) return;
  retired_ = true;
  if (options_.services.failures && worker_ && worker_->stats()) {
    const JobStatsSnapshot done = worker_->stats()->snapshot();
    options_.services.failures->add_ended(done.operations, done.bytes, done.cross_node_bytes, failed_with_work_);
  }
}

Job::~Job() {
  *alive_ = nullptr;
  retire();
  if (options_.services.progress) options_.services.progress->remove(store_job(), worker_.get());
  const Status ended = Status::aborted("job " + params().id + " ended");
  fail_pending(ended);
  // The worker owns the rings it drains; it goes to the reaper, which stops it off the io thread.
  // So do the job's sets, so that a large set's memory is freed (and returned, reaper.h) there.
  options_.services.reaper->adopt([worker = std::move(worker_), ended, sets = std::move(committed_),
                          ticket = std::move(options_.ticket)]() mutable {
    worker->stop(ended);
    worker.reset();
    sets.clear();
    ticket.reset();  // the job no longer counts against the limits
  });
  log_.info("removed: every rank has left");
}

std::string Job::describe_member(int local_rank) const {
  const auto& member = members_[static_cast<size_t>(local_rank)];
  std::string text = "rank " + std::to_string(params().topology.rank_of(local_rank));
  if (member) text += " (pid " + std::to_string(member->pid) + ")";
  return text;
}

Status Job::admit(const MemberInfo& member, std::shared_ptr<ClientChannel> channel, ChannelFds* fds) {
  const JobParams& p = params();
  if (const Status failed = failure(); !failed.ok()) {
    return Status::aborted("job " + p.id + " has failed (" + failed.message() + "); it re-forms once its " +
                           "remaining clients have disconnected or re-joined");
  }
  if (member.rank / p.local_world_size != p.topology.node) {
    return Status::invalid_argument("rank " + std::to_string(member.rank) + " belongs to node " +
                                    std::to_string(member.rank / p.local_world_size) + ", but job " + p.id +
                                    " on this daemon is node " + std::to_string(p.topology.node));
  }
  if (member.local_rank < 0 || member.local_rank >= p.local_world_size) {
    return Status::invalid_argument("local rank " + std::to_string(member.local_rank) +
                                    " is outside local world size " + std::to_string(p.local_world_size));
  }
  auto& slot = members_[static_cast<size_t>(member.local_rank)];
  if (slot) {
    return Status::already_exists("rank " + std::to_string(member.rank) + " already joined job " + p.id +
                                  " (pid " + std::to_string(slot->pid) + ")");
  }
  fds->doorbell = doorbell_->duplicate();
  fds->client_rings = channel->release_client_fd();
  fds->daemon_rings = channel->release_daemon_fd();
  worker_->attach_client(static_cast<uint32_t>(member.local_rank), std::move(channel));
  slot = member;
  log_.info("rank " + std::to_string(member.rank) + " joined (pid " + std::to_string(member.pid) + ", uid " +
            std::to_string(member.uid) + ")");
  return Status::ok_status();
}

void Job::leave(int local_rank, const Status& why) {
  auto& slot = members_[static_cast<size_t>(local_rank)];
  if (!slot) return;
  log_.info(describe_member(local_rank) + " left: " + why.message());
  slot.reset();
  released_events_.erase(local_rank);  // its imported events went with its connection
  fail(why);
}

JobInfo Job::info() const {
  JobInfo info;
  const JobParams& p = params();
  info.id = p.id;
  info.uid = p.uid;
  info.incarnation = incarnation();
  const Status why = failure();
  info.state = why.ok() ? "running" : "failed";
  // Failures can quote text from clients and other nodes: shown by gradsyncctl and sent in
  // protobuf strings, it must be printable UTF-8 (safe_text.h).
  info.last_error = why.ok() ? "" : safe_text(why.to_string(), kMaxLastErrorBytes);
  info.world_size = p.world_size;
  info.local_world_size = p.local_world_size;
  info.node = p.topology.node;
  info.nodes = p.topology.nodes;
  info.groups = p.topology.groups;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (members_[r]) info.local_ranks_joined.push_back(static_cast<int>(r));
  }
  info.sets = static_cast<uint32_t>(committed_.size());
  for (const auto& [id, set] : committed_) {
    uint64_t per_rank = 0;
    for (const auto& bucket : set->plan.buckets) per_rank += bucket.bytes;
    info.registered_bytes += per_rank * set->address.size();
  }
  info.operations_done = worker_->completed_ops();
  info.operations_pending = static_cast<uint32_t>(worker_->pending_ops());
  info.age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - formed_);
  return info;
}

bool Job::empty() const {
  for (const auto& member : members_) {
    if (member) return false;
  }
  return true;
}

Status Job::failure() const { return failure_.ok() ? worker_->failure() : failure_; }

Status Job::failed_status() const {
  // The failure's own code where it says why the job failed (a lost rank, a timeout, a layout
  // mismatch, the daemon stopping), so that a registration meeting it raises the class its
  // operations do (PeerLostError, ...), not a bare "aborted". A code that would call this
  // registration the caller's own mistake (an argument, a name) is "aborted" instead.
  ErrorCode code = failure_.code();
  if (code == ErrorCode::kInvalidArgument || code == ErrorCode::kNotFound || code == ErrorCode::kAlreadyExists ||
      code == ErrorCode::kNotSupported) {
    code = ErrorCode::kAborted;
  }
  return Status(code, "job " + params().id + " has failed: " + failure_.message(), failure_.where());
}

void Job::fail(const Status& status) {
  if (!failure_.ok()) return;
  failure_ = status;
  // A client leaving between steps is how a job normally ends; only interrupted work is a
  // warning, and a failure (gradsync_job_failures_total).
  if (worker_->pending_ops() > 0 || !pending_.empty()) {
    failed_with_work_ = true;
    if (options_.services.failures) options_.services.failures->add(status.code());
    log_.warning("failed: " + status.to_string());
  } else {
    // No error: nothing was in flight. Said as what it is, not as a lost peer.
    log_.info("ended: " + status.message() + " between operations, after " +
              std::to_string(worker_->completed_ops()) + " operations; the job takes no new work");
  }
  fail_pending(status);
  // Never waits: the worker notices within the bucket it is executing, fails the pending
  // operations, and drops its references to client memory; the job's own go now.
  worker_->fail(status);
  committed_.clear();
  released_.clear();
}

void Job::fail_pending(const Status& status) {
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [set_id, set] : pending) {
    for (auto& [local_rank, registration] : set.by_local_rank) registration.done(status, nullptr);
  }
}

namespace {

// How messages name a set still being registered: by its first local rank's label.
std::string pending_name(uint32_t set_id, const std::map<int, SetRegistration>& by_local_rank) {
  return set_name(set_id, by_local_rank.empty() ? std::string_view() : by_local_rank.begin()->second.label);
}

}  // namespace

void Job::register_set(int local_rank, SetRegistration registration) {
  const uint32_t set_id = registration.set_id;
  const std::string name = set_name(set_id, registration.label);
  if (!failure_.ok()) {
    registration.done(failed_status(), nullptr);
    return;
  }
  if (committed_.count(set_id) || committing_.count(set_id)) {
    registration.done(Status::already_exists(name + " is already registered in job " +
                                             params().id),
                      nullptr);
    return;
  }
  if (released_ids_.count(set_id)) {
    // Per-set state elsewhere (an executor's tables, other nodes' layout records) is keyed by
    // the id: a released id is never a new set's.
    registration.done(Status::invalid_argument(name + " was released in job " + params().id +
                                               "; a released set's id is not registered again"),
                      nullptr);
    return;
  }
  PendingSet& pending = pending_[set_id];
  if (pending.by_local_rank.count(local_rank)) {
    registration.done(Status::already_exists(name + " is already being registered by " +
                                             describe_member(local_rank)),
                      nullptr);
    return;
  }
  if (!pending.deadline) {
    pending.serial = next_serial_++;
    pending.deadline = std::make_unique<boost::asio::steady_timer>(*options_.services.io, params().timeout);
    // A handler that already fired is not stopped by cancel(), so it checks that the job and
    // this very barrier still exist.
    pending.deadline->async_wait([weak = weak_from_this(), set_id, serial = pending.serial](
                                     const boost::system::error_code& ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->expire(set_id, serial);
    });
  }
  pending.by_local_rank.emplace(local_rank, std::move(registration));
  if (static_cast<int>(pending.by_local_rank.size()) == params().local_world_size) commit(set_id);
}

Status Job::release_set(int local_rank, uint32_t set_id, uint64_t* tensors) {
  const auto it = committed_.find(set_id);
  if (it == committed_.end()) {
    if (!failure_.ok()) return Status::ok_status();  // the failure dropped every set already
    if (pending_.count(set_id) || committing_.count(set_id)) {
      return Status::invalid_argument("release: set " + std::to_string(set_id) + " of job " + params().id +
                                      " is still being registered");
    }
    return Status::not_found("release: set " + std::to_string(set_id) + " is not registered in job " + params().id);
  }
  std::set<int>& by = released_[set_id];
  if (!by.insert(local_rank).second) {
    return Status::invalid_argument("release: " + it->second->name() + " was already released by " +
                                    describe_member(local_rank));
  }
  // A device set's tensors keep counting against --max-tensors-per-client: its event rings
  // (128 interprocess events per local rank) stay until the client leaves (below), and that
  // limit is what bounds how many a client can make.
  *tensors = it->second->memory_kind == MemoryKind::kHostMemfd ? it->second->layout.size() : 0;
  if (static_cast<int>(by.size()) < params().local_world_size) return Status::ok_status();
  log_.info(it->second->name() + " released by every local rank");
  // A device set's event rings are the daemon's; each client opened them (CUDA IPC), and its
  // Works of the set may still wait on them after the release. An imported event must not
  // outlive the exported one, so they stay until that client leaves the job.
  for (size_t c = 0; c < it->second->events.size(); ++c) {
    if (it->second->events[c]) released_events_[static_cast<int>(c)].push_back(it->second->events[c]);
  }
  committed_.erase(it);
  released_.erase(set_id);
  released_ids_.insert(set_id);
  worker_->retire_set(set_id);
  return Status::ok_status();
}

void Job::expire(uint32_t set_id, uint64_t serial) {
  auto it = pending_.find(set_id);
  if (it == pending_.end() || it->second.serial != serial) return;
  std::string missing;
  for (int c = 0; c < params().local_world_size; ++c) {
    if (!it->second.by_local_rank.count(c)) missing += (missing.empty() ? "" : ", ") + std::to_string(c);
  }
  const Status status = Status::timeout("job " + params().id + ": " + pending_name(set_id, it->second.by_local_rank) +
                                        " was not registered by rank(s) " + missing + " within " +
                                        std::to_string(params().timeout.count()) + " ms");
  log_.warning(status.message());
  PendingSet pending = std::move(it->second);
  pending_.erase(it);
  for (auto& [local_rank, registration] : pending.by_local_rank) registration.done(status, nullptr);
}

namespace {

// Checks that every local client described the same set and builds it (plan included): the
// expensive half of a commit, run off the io thread. The error is the first difference.
Status build_set(const std::string& job_id, uint32_t set_id, const Topology& topology,
                 std::map<int, SetRegistration>& regs, std::shared_ptr<TensorSet>* out) {
  const SetRegistration& first = regs.begin()->second;
  const std::string name = "job " + job_id + ": " + pending_name(set_id, regs);
  for (auto& [local_rank, reg] : regs) {
    if (auto diff = plan::first_difference(first.layout, regs.begin()->first, reg.layout, local_rank)) {
      return Status::layout_mismatch(name + " layout mismatch: " + *diff);
    }
    if (reg.bucket_cap != first.bucket_cap) {
      return Status::layout_mismatch(name + ": bucket cap differs: rank " + std::to_string(regs.begin()->first) +
                                     " asked " + std::to_string(first.bucket_cap) + " bytes, rank " +
                                     std::to_string(local_rank) + " asked " + std::to_string(reg.bucket_cap));
    }
    if ((reg.gather_output == nullptr) != (first.gather_output == nullptr)) {
      return Status::layout_mismatch(name + ": rank " + std::to_string(regs.begin()->first) +
                                     (first.gather_output ? " registered" : " did not register") +
                                     " an allgather output, rank " + std::to_string(local_rank) +
                                     (reg.gather_output ? " did" : " did not"));
    }
    if ((reg.shard_output == nullptr) != (first.shard_output == nullptr)) {
      return Status::layout_mismatch(name + ": rank " + std::to_string(regs.begin()->first) +
                                     (first.shard_output ? " registered" : " did not register") +
                                     " a reduce-scatter output, rank " + std::to_string(local_rank) +
                                     (reg.shard_output ? " did" : " did not"));
    }
    if ((reg.mask == nullptr) != (first.mask == nullptr) || (reg.mask && *reg.mask != *first.mask)) {
      const auto kept = [](const SetRegistration& r) {
        return r.mask ? "a mask keeping " + std::to_string(r.mask->size()) + " elements" : std::string("no mask");
      };
      return Status::layout_mismatch(name + ": rank " + std::to_string(regs.begin()->first) + " registered " +
                                     kept(first) + ", rank " + std::to_string(local_rank) + " " + kept(reg) +
                                     (reg.mask && first.mask && reg.mask->size() == first.mask->size()
                                          ? " (other indices)"
                                          : "") +
                                     "; every rank gives the same mask");
    }
  }
  auto set = std::make_shared<TensorSet>();
  set->mask = first.mask;
  if (set->mask) set->mask_digest = mask_digest(*set->mask);
  set->id = set_id;
  set->label = first.label;
  set->layout = first.layout;
  set->bucket_cap = first.bucket_cap;
  for (auto& [local_rank, reg] : regs) {
    set->address.push_back(std::move(reg.address));
    if (reg.gather_output) set->gather_output.push_back(reg.gather_output);
    if (reg.shard_output) set->shard_output.push_back(reg.shard_output);
    set->regions.insert(set->regions.end(), reg.regions.begin(), reg.regions.end());
    set->events.push_back(reg.events);
    reg.layout = {};  // the set's copy is the one kept
  }
  if (std::all_of(set->events.begin(), set->events.end(), [](const auto& e) { return e == nullptr; })) {
    set->events.clear();
  }
  // One executor runs a set, so its memory is of one kind.
  if (!set->regions.empty()) set->memory_kind = set->regions.front()->kind();
  for (const auto& region : set->regions) {
    if (region->kind() == set->memory_kind) continue;
    return Status::invalid_argument(name + " mixes memory kinds (" + std::string(memory_kind_name(set->memory_kind)) +
                                    " and " + std::string(memory_kind_name(region->kind())) +
                                    "); register one set per kind");
  }
  complete_tensor_set(set.get(), topology);
  *out = std::move(set);
  return Status();
}

}  // namespace

void Job::commit(uint32_t set_id) {
  auto pending = std::make_shared<PendingSet>(std::move(pending_[set_id]));
  pending_.erase(set_id);
  pending->deadline->cancel();
  pending->deadline.reset();  // an io object: not destroyed on a setup thread
  committing_.insert(set_id);
  struct Built {
    Status status;
    std::shared_ptr<TensorSet> set;
  };
  auto build = [pending, set_id, id = params().id, topology = params().topology] {
    Built built;
    built.status = build_set(id, set_id, topology, pending->by_local_rank, &built.set);
    return built;
  };
  // The registrations' callbacks answer the clients; they stay on the io thread's side.
  auto finish = [weak = weak_from_this(), pending, set_id](Built built) {
    auto self = weak.lock();
    if (!self) {
      for (auto& [local_rank, reg] : pending->by_local_rank) {
        reg.done(Status::aborted("job ended while " + pending_name(set_id, pending->by_local_rank) +
                                 " was being registered"),
                 nullptr);
      }
      return;
    }
    try {
      self->committed(set_id, std::move(built.status), std::move(built.set), std::move(pending->by_local_rank));
    } catch (const std::exception& e) {
      // Out of memory, say: the job fails (its clients hear why), the daemon does not.
      self->fail(Status::internal("job " + self->params().id + ": committing " +
                                  pending_name(set_id, pending->by_local_rank) +
                                  " failed: " + e.what()));
    }
  };
  // Comparing and planning a set of a million tensors takes a while: off the io thread.
  if (options_.services.setup) return options_.services.setup->run(std::move(build), std::move(finish));
  finish(build());
}

void Job::committed(uint32_t set_id, Status status, std::shared_ptr<TensorSet> set,
                    std::map<int, SetRegistration> regs) {
  committing_.erase(set_id);
  if (status.ok() && !failure_.ok()) status = failed_status();
  if (!status.ok()) {
    log_.warning(status.message());
    for (auto& [local_rank, reg] : regs) reg.done(status, nullptr);
    return;
  }
  committed_[set_id] = set;
  log_.info(set->name() + " registered locally: " + std::to_string(set->layout.size()) +
            " tensors, " + std::to_string(set->plan.buckets.size()) + " buckets");
  // The worker admits the set (after the other nodes agree, for a multi-node job) and the
  // replies go out from the io thread. The callbacks hold only weak references to sessions.
  auto callbacks = std::make_shared<std::vector<std::function<void(const Status&, const TensorSet*)>>>();
  for (auto& [local_rank, reg] : regs) callbacks->push_back(std::move(reg.done));
  boost::asio::io_context* io = options_.services.io;
  worker_->admit_set(set, [io, set, callbacks](const Status& status) {
    boost::asio::post(*io, [set, callbacks, status] {
      for (auto& done : *callbacks) done(status, status.ok() ? set.get() : nullptr);
    });
  });
}

}  // namespace gradsync
