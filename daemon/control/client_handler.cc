#include "daemon/control/client_handler.h"

#include "daemon/control/register_reply.h"

#include "daemon/control/registration_check.h"
#include "daemon/util/safe_text.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "shared/dtype.h"
#include "shared/version.h"

namespace gradsync {

namespace asio = boost::asio;

constexpr size_t kMaxReplyMessageBytes = 2048;

void set_error(const Status& status, control::Reply* reply) {
  reply->mutable_error()->set_code(static_cast<uint32_t>(status.code()));
  // Error messages echo what clients sent: bounded, one line, valid UTF-8 (a protobuf string).
  reply->mutable_error()->set_message(safe_text(status.message(), kMaxReplyMessageBytes));
}

ClientHandler::ClientHandler(ClientHandlerOptions options) : options_(std::move(options)) {}

ClientHandler::~ClientHandler() { disconnected(Status()); }

std::string ClientHandler::who() const {
  std::string text = "client pid " + std::to_string(options_.peer.pid);
  if (job_) text = "rank " + std::to_string(rank_) + " (" + text + ")";
  return text;
}

void ClientHandler::disconnected(const Status& why) {
  closed_ = true;
  // A request waiting for a setup thread goes on at once, as aborted: the connection's end
  // does not wait for an import stuck in a driver.
  if (std::function<void()> abandon = std::exchange(abandon_, nullptr)) abandon();
  if (!job_) return;
  // Daemon shutdown is not the client's fault: the others learn the daemon's reason.
  if (why.code() == ErrorCode::kAborted) return leave_job(why);
  const std::string how = why.ok() ? "disconnected" : "was disconnected: " + why.message();
  leave_job(Status::peer_lost("job " + job_->params().id + ": " + who() + " " + how));
}

void ClientHandler::leave_job(const Status& why) {
  if (!job_) return;
  std::shared_ptr<Job> job = std::move(job_);
  job_.reset();
  job->leave(local_rank_, why);
  options_.context.registry->left(job);
  // The job's sets are gone with it; callbacks still to come count against the old tally.
  tensors_ = std::make_shared<uint64_t>(0);
  mask_tickets_ = std::make_shared<std::map<uint32_t, UserCounts::Ticket>>();
}

ClientInfo ClientHandler::info() const {
  ClientInfo info;
  info.pid = options_.peer.pid;
  info.uid = options_.peer.uid;
  info.name = name_;
  if (job_) {
    info.job = job_->params().id;
    info.rank = rank_;
    info.local_rank = local_rank_;
    info.state = job_->failure().ok() ? "joined" : "job failed";
  } else {
    info.state = greeted_ ? "connected" : "connecting";
  }
  info.segments = static_cast<uint32_t>(segments_.size());
  for (const auto& [id, region] : segments_) info.segment_bytes += region->size();
  info.idle = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - last_request_);
  return info;
}

namespace {

// An awaitable that is ready with `value`.
template <class Value>
asio::awaitable<Value> ready(Value value) {
  co_return value;
}

}  // namespace

template <class Work>
asio::awaitable<std::invoke_result_t<Work&>> ClientHandler::off_io(Work work) {
  if (!options_.context.setup) {  // tests: inline
    auto value = SetupThreads::guarded(work);
    return ready(std::move(value));
  }
  return options_.context.setup->offload(std::move(work), &abandon_);
}

void ClientHandler::dispose(control::Request request) {
  if (!options_.context.setup || request.register_().tensors_size() < 4096) return;
  const bool large = request.ByteSizeLong() > (1u << 20);
  options_.context.setup->dispose(std::make_shared<control::Request>(std::move(request)), large);
}

asio::awaitable<ClientHandler::Answer> ClientHandler::serve(control::Request request, std::vector<UniqueFd> fds) {
  last_request_ = std::chrono::steady_clock::now();
  const uint64_t id = request.id();  // read before a registration moves the request on
  Answer answer;
  answer.reply.emplace().set_id(id);
  Status status;
  // A Segment carries its buffer's descriptor, except device memory passed as a legacy IPC handle.
  const bool takes_fd = request.body_case() == control::Request::kSegment &&
                        memory_kind_takes_fd(static_cast<MemoryKind>(request.segment().kind()));
  if (!greeted_ && request.body_case() != control::Request::kHello) {
    status = Status::protocol("the first request must be Hello");
  } else if (fds.size() != (takes_fd ? 1u : 0u)) {
    status = Status::invalid_argument(takes_fd ? "a Segment request carries exactly one file descriptor, got " +
                                                     std::to_string(fds.size())
                                               : "this request carries no file descriptors, got " +
                                                     std::to_string(fds.size()) +
                                                     (request.body_case() == control::Request::kSegment
                                                          ? " (a CUDA legacy IPC segment travels as its handle)"
                                                          : ""));
  } else {
    switch (request.body_case()) {
      case control::Request::kHello: status = on_hello(request.hello(), &answer); break;
      case control::Request::kJoin: status = co_await on_join(request.join(), &answer); break;
      case control::Request::kSegment: status = co_await on_segment(request.segment(), &fds, &answer); break;
      case control::Request::kRegister: status = co_await on_register(&request, &answer); break;
      case control::Request::kRelease: status = on_release(request.release(), &answer); break;
      case control::Request::kFreeSegment: status = co_await on_free_segment(request.free_segment(), &answer); break;
      case control::Request::BODY_NOT_SET: status = Status::invalid_argument("empty or unknown request type"); break;
    }
  }
  if (!status.ok()) {
    refusals_.note(options_.log, LogLevel::kInfo, who() + ": request refused: " + status.to_string());
    answer.reply.emplace().set_id(id);
    set_error(status, &*answer.reply);
    answer.fds.clear();
  }
  co_return answer;
}

Status ClientHandler::on_hello(const control::Hello& hello, Answer* answer) {
  if (hello.protocol_version() != kProtocolVersion) {
    return Status::not_supported("protocol version " + std::to_string(hello.protocol_version()) +
                                 " is not supported; this daemon speaks version " + std::to_string(kProtocolVersion));
  }
  greeted_ = true;
  // Shown to operators (gradsyncctl clients): printable ASCII only, so a name cannot carry
  // terminal escapes.
  name_ = hello.client_name().substr(0, 64);
  for (char& c : name_) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  answer->reply->mutable_hello()->set_protocol_version(kProtocolVersion);
  answer->reply->mutable_hello()->set_daemon_version(kGradsyncVersion);
  return Status::ok_status();
}

asio::awaitable<Status> ClientHandler::on_join(const control::JoinRequest& join, Answer* answer) {
  // Joining again re-forms: the old job (if any) fails for its other members, who re-join too.
  if (job_) leave_job(Status::peer_lost("job " + job_->params().id + ": " + who() + " left to join again"));
  // The channel (and a doorbell, in case this join forms the job) is memory to create and map:
  // off the io thread. The registry then decides, on the io thread, what the join means.
  struct Prepared {
    Status status;
    std::shared_ptr<ClientChannel> channel;
    std::shared_ptr<JobDoorbell> doorbell;
  };
  auto make = [] {
    Prepared made;
    made.channel = std::make_shared<ClientChannel>();
    made.doorbell = std::make_shared<JobDoorbell>();
    return made;
  };
  auto pending = off_io(std::move(make));
  Prepared prepared = co_await std::move(pending);
  if (!prepared.status.ok()) co_return prepared.status;
  // A connection that ended meanwhile joins nothing: it would leave a member nobody removes.
  if (closed_) co_return Status::aborted("the connection closed while joining");
  MemberInfo member{join.rank(), join.local_rank(), options_.peer.pid, options_.peer.uid};
  std::shared_ptr<Job> job;
  Job::ChannelFds channel;
  // A join that throws (no descriptor left for the doorbell's copy, no thread for the job's
  // worker) is refused like any other; the connection stays.
  Status joined;
  try {
    joined = options_.context.registry->join(join, member, std::move(prepared.channel),
                                             std::move(prepared.doorbell), &job, &channel);
  } catch (const Error& e) {
    joined = e.status();
  } catch (const std::exception& e) {  // no thread for the job's worker
    joined = Status::internal(std::string("joining failed: ") + e.what());
  }
  if (!joined.ok()) co_return joined;
  job_ = std::move(job);
  rank_ = join.rank();
  local_rank_ = join.local_rank();
  auto* body = answer->reply->mutable_join();
  body->set_timeout_ms(static_cast<uint32_t>(job_->params().timeout.count()));
  body->set_doorbell_bytes(kDoorbellBytes);
  body->set_client_rings_bytes(kClientRingsBytes);
  body->set_daemon_rings_bytes(kDaemonRingsBytes);
  answer->fds.resize(kJoinFdCount);
  answer->fds[kJoinFdDoorbell] = std::move(channel.doorbell);
  answer->fds[kJoinFdClientRings] = std::move(channel.client_rings);
  answer->fds[kJoinFdDaemonRings] = std::move(channel.daemon_rings);
  co_return Status::ok_status();
}

asio::awaitable<Status> ClientHandler::on_segment(const control::SegmentRequest& request, std::vector<UniqueFd>* fds,
                                                  Answer* answer) {
  const LocalLimits& limits = options_.context.users->limits();
  if (segments_.size() >= limits.segments_per_client) {
    co_return limit_reached("this client already announced " + std::to_string(segments_.size()) +
                             " memory segments, at most " + std::to_string(limits.segments_per_client) +
                             " per client (use fewer, larger segments)",
                         "max-segments-per-client", limits.segments_per_client);
  }
  // The budget counts what the client announced; the import checks the memory is that size
  // (an empty sealed memfd costs no memory, but its whole size of the daemon's address space).
  // Host memory only: a GPU's memory is bounded by the GPU, and may exceed the host's.
  const LocalLimits& budget = options_.context.users->limits();
  const bool host = request.kind() == control::HOST_MEMFD;
  if (host && request.bytes() > budget.segment_bytes) {
    co_return limit_reached("a segment of " + describe_bytes(request.bytes()) + ", at most " +
                             describe_bytes(budget.segment_bytes) + " per segment",
                         "max-segment-bytes", budget.segment_bytes);
  }
  SegmentTickets ticket;
  if (Status status = options_.context.users->take(UserCounts::What::kSegments, options_.peer.uid, 1, &ticket.count);
      !status.ok()) {
    co_return status;
  }
  if (Status status =
          options_.context.users->take(UserCounts::What::kBytes, options_.peer.uid, host ? request.bytes() : 0, &ticket.bytes);
      !status.ok()) {
    co_return status;
  }
  MemoryImport what;
  what.kind = static_cast<MemoryKind>(request.kind());
  what.bytes = request.bytes();
  if (!fds->empty()) what.fd = std::move((*fds)[0]);
  what.device_uuid = request.device_uuid();
  what.ipc_handle = request.ipc_handle();
  what.ipc_offset = request.ipc_offset();
  what.uid = options_.peer.uid;
  struct Imported {
    Status status;
    std::shared_ptr<MemoryRegion> region;
  };
  // Mapping (and for device memory, opening) the buffer is setup work: off the io thread.
  auto import = [backends = options_.context.backends, what = std::move(what)]() mutable {
    Imported result;
    result.status = backends->import_memory(std::move(what), &result.region);
    return result;
  };
  auto pending = off_io(std::move(import));
  Imported imported = co_await std::move(pending);
  if (!imported.status.ok()) {
    co_return Status(imported.status.code(), "segment: " + imported.status.message(), imported.status.where());
  }
  if (closed_) co_return Status::aborted("the connection closed while its segment was imported");
  // The descriptor is closed; the memory lives exactly as long as the two mappings, so a
  // client killed at any later point leaves nothing behind.
  // Ids are reused only once free (freed segments make them wrap around in time), never 0.
  while (next_segment_id_ == 0 || segments_.contains(next_segment_id_)) ++next_segment_id_;
  const uint32_t id = next_segment_id_++;
  segments_[id] = std::move(imported.region);
  segment_tickets_.emplace(id, std::move(ticket));
  answer->reply->mutable_segment()->set_segment_id(id);
  co_return Status::ok_status();
}

namespace {

// Device sets: makes the client's event rings on the GPU of its tensors (`used` regions).
Status create_set_events(BackendFactory* backends, const std::vector<const MemoryRegion*>& used,
                         std::shared_ptr<const ClientEvents>* events) {
  // A device set lives on one GPU per client: its event rings are made there.
  std::set<int> devices;
  for (const MemoryRegion* region : used) devices.insert(region->device());
  const bool device_set = !devices.empty() && *devices.rbegin() >= 0;
  if (!device_set) return Status::ok_status();
  if (devices.size() != 1) {
    std::string list;
    for (int d : devices) list += (list.empty() ? "" : " and ") + (d < 0 ? std::string("host") : std::to_string(d));
    return Status::invalid_argument("register: a set's tensors must be on one GPU per client, these are on " + list);
  }
  Status status = backends->create_events(*devices.begin(), events);
  if (!status.ok()) return Status(status.code(), "register: " + status.message(), status.where());
  return Status::ok_status();
}

}  // namespace

Status ClientHandler::on_release(const control::ReleaseRequest& release, Answer* answer) {
  if (!job_) return Status::invalid_argument("join a job before releasing a set");
  uint64_t tensors = 0;
  if (Status status = job_->release_set(local_rank_, release.set_id(), &tensors); !status.ok()) return status;
  *tensors_ -= std::min(*tensors_, tensors);  // this client's registered tensors
  mask_tickets_->erase(release.set_id());
  answer->reply->mutable_release();
  return Status::ok_status();
}

asio::awaitable<Status> ClientHandler::on_free_segment(const control::FreeSegmentRequest& request, Answer* answer) {
  const uint32_t id = request.segment_id();
  auto found = segments_.find(id);
  if (found == segments_.end()) {
    co_return Status::invalid_argument("free: segment " + std::to_string(id) + " is not one of this client's (" +
                                       std::to_string(segments_.size()) + " announced and not freed)");
  }
  // Only this handler holds it: no set of the client's (registered, waiting, or released but
  // not yet dropped by every local client), no operation in flight, and for device memory no
  // NCCL registration (the CUDA executor holds the region until it undid the registration, once
  // the GPU is through the sets that used it). Every other holder got its reference from
  // segments_ on this thread, so none can appear while this runs.
  if (found->second.use_count() > 1) {
    co_return Status::invalid_argument(
        "free: segment " + std::to_string(id) +
        " is still used by a set of this client's (registered, or released but not yet dropped: the daemon drops a "
        "set once every local client released it" +
        (found->second->device() >= 0 ? std::string(", and undoes its NCCL registration once the GPU is through it)")
                                      : std::string(")")));
  }
  std::shared_ptr<const MemoryRegion> region = std::move(found->second);
  segments_.erase(found);
  auto charged = segment_tickets_.extract(id);
  // Unmapping (closing device memory, which may wait for the GPU) is setup work, off the io
  // thread; the user's charge goes back once the memory is gone.
  auto drop = [region = std::move(region), charged = std::move(charged)]() mutable {
    region.reset();
    charged = {};
    return Status::ok_status();
  };
  auto pending = off_io(std::move(drop));
  Status dropped = co_await std::move(pending);
  // Aborted only when the connection closed meanwhile: the memory is gone all the same.
  if (!dropped.ok()) co_return dropped;
  answer->reply->mutable_free_segment();
  co_return Status::ok_status();
}

asio::awaitable<Status> ClientHandler::on_register(control::Request* request, Answer* answer) {
  const control::RegisterRequest& body = request->register_();
  const bool body_has_mask = body.has_mask();  // the request moves off the io thread below
  const uint64_t count = static_cast<uint64_t>(body.tensors_size());
  const LocalLimits& limits = options_.context.users->limits();
  // Waiting registrations count, and their memory counts against the user's byte budget, until
  // the barrier answers them.
  auto ticket = std::make_shared<SegmentTickets>();
  Status refused;
  if (!job_) {
    refused = Status::invalid_argument("join a job before registering tensors");
  } else if (count == 0) {
    refused = Status::invalid_argument("a tensor set needs at least one tensor");
  } else if (*tensors_ + count > limits.tensors_per_client) {
    refused = limit_reached("this client would register " + std::to_string(*tensors_ + count) + " tensors (" +
                                std::to_string(count) + " in set " + std::to_string(body.set_id()) + "), at most " +
                                std::to_string(limits.tensors_per_client) + " per client",
                            "max-tensors-per-client", limits.tensors_per_client);
  } else if (Status status = options_.context.users->take(UserCounts::What::kPendingRegistrations, options_.peer.uid, 1,
                                                  &ticket->count);
             !status.ok()) {
    refused = status;
  } else if (Status bytes = options_.context.users->take(UserCounts::What::kBytes, options_.peer.uid,
                                                 count * kBytesPerPendingTensor, &ticket->bytes);
             !bytes.ok()) {
    refused = Status(bytes.code(), "registering " + std::to_string(count) + " tensors: " + bytes.message(),
                     bytes.where());
  }
  // A mask's indices live in the daemon as long as the set: charged for that long (one segment
  // could otherwise serve as the mask of any number of sets, each copied anew).
  UserCounts::Ticket mask_bytes;
  if (refused.ok() && body.has_mask()) {
    constexpr uint64_t kMostIndices = std::numeric_limits<uint64_t>::max() / kBytesPerMaskIndex;
    if (body.mask_count() > kMostIndices) {
      refused = Status::invalid_argument("set " + std::to_string(body.set_id()) + ": a mask of " +
                                         std::to_string(body.mask_count()) + " indices");
    } else if (Status bytes = options_.context.users->take(UserCounts::What::kBytes, options_.peer.uid,
                                                           body.mask_count() * kBytesPerMaskIndex, &mask_bytes);
               !bytes.ok()) {
      refused = Status(bytes.code(), "registering set " + std::to_string(body.set_id()) + "'s mask of " +
                                         std::to_string(body.mask_count()) + " indices: " + bytes.message(),
                       bytes.where());
    }
  }
  if (!refused.ok()) {
    dispose(std::move(*request));
    co_return refused;
  }
  // A registration may hold a million tensors: it is resolved and checked off the io thread,
  // against a snapshot of the segments (which only this client's requests change, and the next
  // one waits). The decoded request is freed there too.
  struct Checked {
    Status status;
    SetRegistration reg;
  };
  const std::weak_ptr<Job> joined = job_;
  auto check = [request = std::move(*request), topology = job_->params().topology, world = job_->params().world_size,
                segments = segments_, backends = options_.context.backends, setup = options_.context.setup]() mutable {
        Checked result;
        ResolvedSet resolved;
        result.status = check_registration(request.register_(), topology, world, segments, &resolved);
        if (result.status.ok()) result.status = create_set_events(backends, resolved.used, &result.reg.events);
        if (result.status.ok()) {
          result.reg.set_id = resolved.set_id;
          result.reg.label = std::move(resolved.label);
          result.reg.bucket_cap = resolved.bucket_cap;
          result.reg.layout = std::move(resolved.layout);
          result.reg.address = std::move(resolved.address);
          result.reg.gather_output = resolved.gather_output;
          result.reg.shard_output = resolved.shard_output;
          result.reg.mask = std::move(resolved.mask);
          result.reg.regions = std::move(resolved.regions);
        }
        // The decoded request's memory goes back to the system now, on this thread.
        const bool large = request.ByteSizeLong() > (1u << 20);
        control::Request().Swap(&request);
        if (large && setup) setup->trim();
        // The snapshot goes before the answer does: the next request (a FreeSegment) must not
        // find a segment still held by it (the work itself is destroyed only after delivery).
        segments.clear();
        return result;
  };
  auto pending = off_io(std::move(check));
  Checked checked = co_await std::move(pending);
  if (!checked.status.ok()) co_return checked.status;
  // The client may have left (or re-joined, or disconnected) meanwhile.
  if (closed_ || job_ == nullptr || job_ != joined.lock()) {
    co_return Status::aborted("the client left its job while registering");
  }
  SetRegistration reg = std::move(checked.reg);
  std::vector<std::string> ready_events, done_events;
  if (reg.events) {
    ready_events = reg.events->ready_handles();
    done_events = reg.events->done_handles();
  }
  *tensors_ += count;
  // This registration's own mask charge: kept by the client once the set is registered, given
  // back with a refusal. Never by set id before then: a second registration of an id in use
  // (refused later, by the job) must not release or replace the charge of the set that has it.
  const uint32_t set_id = reg.set_id;
  auto mask_charge = std::make_shared<UserCounts::Ticket>(std::move(mask_bytes));
  reg.done = [send = options_.send, request_id = answer->reply->id(), ready_events, done_events, ticket,
              tensors = tensors_, count, masks = mask_tickets_, set_id, mask_charge,
              body_has_mask](const Status& status, const TensorSet* set) {
    ticket->count.release();  // no longer waiting
    ticket->bytes.release();
    control::Reply reply;
    reply.set_id(request_id);
    if (status.ok() && body_has_mask) masks->try_emplace(set_id, std::move(*mask_charge));
    mask_charge->release();  // refused, or kept in `masks` by now
    if (!status.ok()) {
      *tensors -= std::min(*tensors, count);
      set_error(status, &reply);
    } else {
      auto* body = reply.mutable_register_();
      fill_register_buckets(set->plan, [set](size_t b) { return set->runs[b].size() <= 1; }, body);
      for (const std::string& handle : ready_events) body->add_ready_events(handle);
      for (const std::string& handle : done_events) body->add_done_events(handle);
    }
    send(reply, {});
  };
  job_->register_set(local_rank_, std::move(reg));
  answer->reply.reset();  // the barrier answers; the client may send its next request now
  co_return Status::ok_status();
}

}  // namespace gradsync
