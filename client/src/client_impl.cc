#include "client/src/client_impl.h"

#include <algorithm>

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <utility>

#include "shared/set_name.h"
#include "shared/shard.h"
#include "shared/version.h"

namespace gradsync {
namespace {

uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

WireReduceOp wire(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return WireReduceOp::kSum;
    case ReduceOp::kAvg: return WireReduceOp::kAvg;
    case ReduceOp::kMin: return WireReduceOp::kMin;
    case ReduceOp::kMax: return WireReduceOp::kMax;
  }
  throw Error(Status::invalid_argument("unknown reduce operation " + std::to_string(static_cast<int>(op))));
}

// No allocation comes near this; below it, sizes and their sums over a flat set cannot wrap.
constexpr uint64_t kMostBytes = uint64_t{1} << 56;

void check_spec(const TensorSpec& spec) {
  if (!dtype_from_raw(static_cast<uint32_t>(spec.dtype))) {
    throw Error(Status::invalid_argument("unknown dtype " + std::to_string(static_cast<uint32_t>(spec.dtype))));
  }
  // numel * the element size would wrap, and the tensor claim more than its memory holds.
  if (spec.numel > kMostBytes / dtype_size(spec.dtype)) {
    throw Error(Status::invalid_argument("a tensor of " + std::to_string(spec.numel) + " " +
                                         std::string(dtype_name(spec.dtype)) + " elements is more than any memory"));
  }
}

// Adds a tensor's bytes to a flat set's; refuses a set whose total no memory could hold.
uint64_t add_bytes(uint64_t total, uint64_t bytes) {
  if (total > kMostBytes - bytes) {
    throw Error(Status::invalid_argument("a flat set of more than " + std::to_string(kMostBytes) + " bytes"));
  }
  return total + bytes;
}

// Where a multi-node job rendezvous: explicit, else $GRADSYNC_RENDEZVOUS, else $MASTER_ADDR
// with the default peer port. Like the socket path, this is the documented edge where the
// library reads the environment. Single-node jobs need none.
std::string resolve_rendezvous(const JoinOptions& options) {
  if (!options.rendezvous.empty()) return options.rendezvous;
  if (options.local_world_size <= 0 || options.world_size <= options.local_world_size) return {};
  if (const char* explicit_address = std::getenv("GRADSYNC_RENDEZVOUS"); explicit_address && *explicit_address) {
    return explicit_address;
  }
  if (const char* master = std::getenv("MASTER_ADDR"); master && *master) {
    return std::string(master) + ":" + std::to_string(kDefaultPeerPort);
  }
  throw Error(Status::invalid_argument("a multi-node job needs a rendezvous: set JoinOptions::rendezvous, "
                                       "GRADSYNC_RENDEZVOUS=host:port (or etcd://host:port,...) or MASTER_ADDR"));
}

// The daemon uid a client trusts beyond root and itself: explicit, else $GRADSYNC_DAEMON_UID.
std::optional<uid_t> resolve_daemon_uid(const ConnectOptions& options) {
  if (options.daemon_uid) return options.daemon_uid;
  const char* text = std::getenv("GRADSYNC_DAEMON_UID");
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  const unsigned long uid = std::strtoul(text, &end, 10);
  if (*end != '\0' || uid > 0xFFFFFFFEul) {
    throw Error(Status::invalid_argument(std::string("GRADSYNC_DAEMON_UID must be a numeric uid, got '") + text + "'"));
  }
  return static_cast<uid_t>(uid);
}

// Maps one of the join reply's descriptors after checking that it is what the daemon says.
Mapping map_channel_fd(const UniqueFd& fd, size_t bytes, Access access, unsigned seals, const std::string& what) {
  throw_if_error(check_memfd(fd.get(), seals, bytes, "the job's " + what));
  Mapping mapping;
  throw_if_error(map_fd(fd.get(), bytes, access, "the job's " + what, &mapping));
  return mapping;
}

// The bound for control calls that wait on other clients (registration barrier).
std::chrono::milliseconds barrier_bound(std::chrono::milliseconds job_timeout) {
  return job_timeout + std::chrono::seconds(5);
}

}  // namespace

std::unique_ptr<Client> Client::connect(const ConnectOptions& options) {
  ConnectOptions resolved = options;
  if (resolved.socket_path.empty()) {
    // The one place the client library reads the environment: the documented way to point a
    // trainer at a daemon without changing its code.
    const char* from_env = std::getenv("GRADSYNC_SOCKET");
    resolved.socket_path = from_env && *from_env ? from_env : kDefaultSocketPath;
  }
  resolved.daemon_uid = resolve_daemon_uid(resolved);
  auto connection = std::make_shared<Connection>(resolved.socket_path, resolved.daemon_uid);
  control::Request request;
  request.mutable_hello()->set_protocol_version(kProtocolVersion);
  request.mutable_hello()->set_client_name(resolved.client_name);
  connection->call(request, resolved.request_timeout);
  return std::make_unique<ClientImpl>(std::move(connection), std::move(resolved));
}

ClientImpl::ClientImpl(std::shared_ptr<Connection> connection, ConnectOptions options)
    : connection_(std::move(connection)), options_(std::move(options)) {}

ClientImpl::~ClientImpl() = default;

void ClientImpl::join(const JoinOptions& options) {
  control::Request request;
  auto* join = request.mutable_join();
  join->set_job_id(options.job_id);
  join->set_rank(options.rank);
  join->set_world_size(options.world_size);
  join->set_local_rank(options.local_rank);
  join->set_local_world_size(options.local_world_size);
  join->set_timeout_ms(static_cast<uint32_t>(options.timeout.count()));
  join->set_rendezvous(resolve_rendezvous(options));
  for (const GroupSpec& group : options.groups) {
    auto* decl = join->add_groups();
    decl->set_name(group.name);
    for (int rank : group.ranks) decl->add_ranks(rank);
  }
  // Whatever happens, the previous incarnation is gone.
  joined_.reset();
  submit_.reset();
  completions_.reset();
  channel_.reset();
  per_join_ = PerJoin{};
  incarnation_++;

  std::vector<UniqueFd> fds;
  const control::Reply reply = connection_->call(request, options_.request_timeout, {}, &fds);
  const auto& body = reply.join();
  if (fds.size() != kJoinFdCount || body.doorbell_bytes() != kDoorbellBytes ||
      body.client_rings_bytes() != kClientRingsBytes || body.daemon_rings_bytes() != kDaemonRingsBytes) {
    throw Error(Status::protocol("gradsyncd's join reply does not match this client's ring layout (" +
                                 std::to_string(fds.size()) + " descriptors)"));
  }
  auto channel = std::make_shared<JobChannel>();
  channel->doorbell = map_channel_fd(fds[kJoinFdDoorbell], kDoorbellBytes, Access::kReadWrite, kSizeSeals, "doorbell");
  channel->client_rings =
      map_channel_fd(fds[kJoinFdClientRings], kClientRingsBytes, Access::kReadWrite, kSizeSeals, "client rings");
  channel->daemon_rings = map_channel_fd(fds[kJoinFdDaemonRings], kDaemonRingsBytes, Access::kReadOnly,
                                         kSizeSeals | F_SEAL_FUTURE_WRITE, "daemon rings");
  if (channel->doorbell_page()->magic != kDoorbellMagic || channel->client()->magic != kClientRingsMagic ||
      channel->daemon()->magic != kDaemonRingsMagic || channel->daemon()->version != kChannelVersion) {
    throw Error(Status::protocol("the job channel from gradsyncd has an unexpected layout"));
  }
  channel_ = channel;
  std::weak_ptr<Connection> weak = connection_;
  // Held, not reached through the connection: a work waited on after the client was destroyed
  // still reports an abort before it as its cause.
  auto aborted = [reason = connection_->shut_down_state()]() { return reason->get(); };
  completions_ = std::make_shared<Completions>(channel_, [weak, aborted]() -> Status {
    if (std::optional<Status> why = aborted()) return *why;
    auto connection = weak.lock();
    if (connection && !connection->peer_closed()) return Status();
    // A daemon that stops says why before it closes; one that died says nothing.
    if (connection) {
      if (std::optional<Status> notice = connection->parting_notice()) return *notice;
    }
    return Status::peer_lost("gradsyncd at " + (connection ? connection->path() : std::string("its socket")) +
                             " went away");
  }, aborted);
  submit_.emplace(&channel_->client()->submit);
  timeout_ = std::chrono::milliseconds(body.timeout_ms());
  joined_ = options;
}

ClientImpl::Segment& ClientImpl::new_segment(size_t bytes) {
  // Sealed against resizing before the daemon sees it; the descriptor closes once the daemon
  // has mapped it, and the two mappings keep the memory alive.
  MappedMemfd memory = MappedMemfd::create("tensor", bytes);
  memory.seal(kSizeSeals);
  control::Request request;
  request.mutable_segment()->set_kind(control::HOST_MEMFD);
  request.mutable_segment()->set_bytes(memory.size());
  const int fd = memory.fd().get();
  const control::Reply reply = connection_->call(request, options_.request_timeout, std::span<const int>(&fd, 1));
  UniqueFd closed = memory.release_fd();
  segments_.push_back(std::make_unique<Segment>(Segment{memory.release_mapping(), reply.segment().segment_id()}));
  return *segments_.back();
}

SharedTensor ClientImpl::allocate(const TensorSpec& spec) {
  check_spec(spec);
  Segment& segment = new_segment(std::max<size_t>(64, round_up(spec.numel * dtype_size(spec.dtype), 64)));
  allocated_.insert(segment.id);
  return SharedTensor(spec.dtype, spec.numel, spec.group, segment.memory.data(), segment.id, 0);
}

std::vector<SharedTensor> ClientImpl::allocate_flat(std::span<const TensorSpec> specs) {
  if (specs.empty()) throw Error(Status::invalid_argument("allocate_flat needs at least one tensor"));
  std::vector<uint64_t> offsets;
  uint64_t bytes = 0;
  for (const auto& spec : specs) {
    check_spec(spec);
    bytes = round_up(bytes, dtype_size(spec.dtype));
    offsets.push_back(bytes);
    bytes = add_bytes(bytes, spec.numel * dtype_size(spec.dtype));
  }
  Segment& segment = new_segment(std::max<uint64_t>(64, round_up(bytes, 64)));
  allocated_.insert(segment.id);
  std::vector<SharedTensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.emplace_back(specs[i].dtype, specs[i].numel, specs[i].group, segment.memory.data() + offsets[i], segment.id,
                         offsets[i]);
  }
  return tensors;
}

Status ClientImpl::copy_to_host(int device, void* to, const void* from, size_t bytes) {
  if (device < 0) return Status::invalid_argument("device must be a CUDA device ordinal, got " + std::to_string(device));
  if (!device_memory_) device_memory_ = make_device_memory();
  return device_memory_->copy_to_host(device, to, from, bytes, stream_);
}

ClientImpl::DeviceSegment& ClientImpl::new_device_segment(int device, size_t bytes) {
  if (device < 0) throw Error(Status::invalid_argument("device must be a CUDA device ordinal, got " + std::to_string(device)));
  if (!device_memory_) device_memory_ = make_device_memory();
  std::unique_ptr<DeviceAllocation> memory;
  throw_if_error(device_memory_->allocate(device, bytes, &memory));
  UniqueFd fd;
  throw_if_error(memory->export_fd(&fd));
  control::Request request;
  request.mutable_segment()->set_kind(control::CUDA_VMM);
  request.mutable_segment()->set_bytes(memory->size());
  request.mutable_segment()->set_device_uuid(memory->device_uuid());
  const int raw = fd.get();
  // On an error reply the allocation is released here and the Error names the daemon's reason.
  const control::Reply reply = connection_->call(request, options_.request_timeout, std::span<const int>(&raw, 1));
  device_segments_.push_back(DeviceSegment{std::move(memory), reply.segment().segment_id()});
  return device_segments_.back();
}

ClientImpl::DeviceSegment& ClientImpl::device_output_segment(int device, size_t bytes) {
  DeviceSegment* kept = free_device_outputs_.take(device, bytes);
  return kept ? *kept : new_device_segment(device, bytes);
}

SharedTensor ClientImpl::allocate_device(const TensorSpec& spec, int device) {
  check_spec(spec);
  DeviceSegment& segment = new_device_segment(device, spec.numel * dtype_size(spec.dtype));
  allocated_.insert(segment.id);
  return SharedTensor(spec.dtype, spec.numel, spec.group, segment.memory->data(), segment.id, 0, device);
}

std::vector<SharedTensor> ClientImpl::allocate_device_flat(std::span<const TensorSpec> specs, int device) {
  if (specs.empty()) throw Error(Status::invalid_argument("allocate_device_flat needs at least one tensor"));
  std::vector<uint64_t> offsets;
  uint64_t bytes = 0;
  for (const auto& spec : specs) {
    check_spec(spec);
    // 16-byte aligned tensors let the daemon's kernels move them 16 bytes at a time.
    bytes = round_up(bytes, std::max<size_t>(16, dtype_size(spec.dtype)));
    offsets.push_back(bytes);
    bytes = add_bytes(bytes, spec.numel * dtype_size(spec.dtype));
  }
  DeviceSegment& segment = new_device_segment(device, bytes);
  allocated_.insert(segment.id);
  std::vector<SharedTensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    tensors.emplace_back(specs[i].dtype, specs[i].numel, specs[i].group, segment.memory->data() + offsets[i], segment.id,
                         offsets[i], device);
  }
  return tensors;
}

SharedTensor ClientImpl::share_device(const TensorSpec& spec, void* data, int device) {
  check_spec(spec);
  if (device < 0) throw Error(Status::invalid_argument("device must be a CUDA device ordinal, got " + std::to_string(device)));
  if (!device_memory_) device_memory_ = make_device_memory();
  std::unique_ptr<DeviceAllocation> memory;
  std::string handle;
  uint64_t offset = 0;
  throw_if_error(device_memory_->describe_foreign(device, data, spec.numel * dtype_size(spec.dtype), &memory, &handle,
                                                  &offset));
  control::Request request;
  request.mutable_segment()->set_kind(control::CUDA_LEGACY_IPC);
  request.mutable_segment()->set_bytes(memory->size());
  request.mutable_segment()->set_device_uuid(memory->device_uuid());
  request.mutable_segment()->set_ipc_handle(handle);
  request.mutable_segment()->set_ipc_offset(offset);
  const control::Reply reply = connection_->call(request, options_.request_timeout);
  device_segments_.push_back(DeviceSegment{std::move(memory), reply.segment().segment_id()});
  return SharedTensor(spec.dtype, spec.numel, spec.group, static_cast<std::byte*>(data), device_segments_.back().id, 0,
                      device);
}

void ClientImpl::require_joined(const char* what) const {
  if (!joined_) throw Error(Status::invalid_argument(std::string("join a job before ") + what));
}

std::string ClientImpl::name_of(uint32_t set_id) const {
  const auto it = per_join_.sets.find(set_id);
  return it != per_join_.sets.end() ? it->second.name : set_name(set_id, "");
}

TensorSet ClientImpl::register_tensors(std::span<const SharedTensor> tensors, const RegisterOptions& options) {
  require_joined("registering tensors");
  if (tensors.empty()) throw Error(Status::invalid_argument("a tensor set needs at least one tensor"));
  throw_if_error(check_set_label(options.label));
  TensorSet set;
  Segment* gather_segment = nullptr;  // a host allgather output, for release() to pass on
  DeviceSegment* gather_device_segment = nullptr;  // a device one
  set.id_ = per_join_.next_set_id;
  set.label_ = options.label;
  set.world_size_ = joined_->world_size;
  set.incarnation_ = incarnation_;
  control::Request request;
  auto* body = request.mutable_register_();
  body->set_set_id(set.id_);
  body->set_label(options.label);
  if (options.bucket_cap_bytes) {
    body->set_has_bucket_cap(true);
    body->set_bucket_cap_bytes(*options.bucket_cap_bytes);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SharedTensor& tensor = tensors[i];
    // A set lives in one kind of memory, and its device tensors on one device.
    if (tensor.device() >= 0) {
      // A device tensor must sit in device memory this client allocated on that device (a
      // SharedTensor can be made by hand).
      const bool ours = std::any_of(device_segments_.begin(), device_segments_.end(), [&](const DeviceSegment& s) {
        return s.id == tensor.segment_id() && s.memory->device() == tensor.device();
      });
      if (!ours) {
        throw Error(Status::invalid_argument("tensor " + std::to_string(i) + " claims device " +
                                             std::to_string(tensor.device()) + " but segment " +
                                             std::to_string(tensor.segment_id()) +
                                             " is not device memory this client allocated there"));
      }
    }
    if (tensor.device() != tensors[0].device()) {
      const auto where = [](int device) { return device < 0 ? std::string("host memory") : "device " + std::to_string(device); };
      throw Error(Status::invalid_argument("tensor " + std::to_string(i) + " is in " + where(tensor.device()) +
                                           " but tensor 0 is in " + where(tensors[0].device()) +
                                           "; a set's tensors share one kind of memory and one device"));
    }
    if (!dtype_from_raw(static_cast<uint32_t>(tensor.dtype()))) {
      throw Error(Status::invalid_argument("tensor " + std::to_string(i) + ": unknown dtype " +
                                           std::to_string(static_cast<uint32_t>(tensor.dtype()))));
    }
    auto* desc = body->add_tensors();
    desc->set_dtype(static_cast<control::DType>(tensor.dtype()));
    desc->set_numel(tensor.numel());
    desc->set_segment_id(tensor.segment_id());
    desc->set_offset(tensor.offset());
    desc->set_group(tensor.group());
    set.packed_offset_.push_back(set.packed_bytes_);
    set.packed_bytes_ += tensor.bytes();
  }
  // Checked before any output is made, so a refusal leaves nothing behind.
  if (!options.mask.empty()) check_mask(options, tensors);
  // The id is used up here, before anything that can fail on one rank only (memory for the
  // outputs), so ids stay aligned across ranks even when a registration fails. (What fails
  // before it, or in reserve_shard's checks after it, fails alike on every rank that registers
  // the same tensors.)
  per_join_.next_set_id++;
  // The outputs taken from the pool or made for this set go back to the pool if the set is not
  // registered: when making them failed, or when the daemon refused the set. Not when the call
  // itself failed (timed out, connection lost): the daemon may still have registered the set
  // with them.
  control::Reply reply;
  bool asked = false;
  const auto give_back_outputs = [&] {
    free_outputs_.give(gather_segment, -1, gather_segment ? gather_segment->memory.size() : 0);
    if (Segment* shard = shard_segment(set)) free_outputs_.give(shard, -1, shard->memory.size());
    if (gather_device_segment) {
      free_device_outputs_.give(gather_device_segment, gather_device_segment->memory->device(),
                                gather_device_segment->memory->size());
    }
    if (DeviceSegment* shard = shard_device_segment(set)) {
      free_device_outputs_.give(shard, shard->memory->device(), shard->memory->size());
    }
  };
  try {
    if (options.reduce_scatter) reserve_shard(tensors, body, &set);
    if (!options.mask.empty()) {
      // The indices travel in the client's mask segment, which the daemon copies at registration.
      const size_t bytes = options.mask.size() * sizeof(uint64_t);
      if (!mask_segment_ || mask_segment_->memory.size() < bytes) {
        const size_t before = mask_segment_ ? mask_segment_->memory.size() : 0;
        Segment* outgrown = mask_segment_;
        mask_segment_ = &new_segment(std::max<size_t>({4096, bytes, 2 * before}));
        // No registration reads the old one again (the daemon copied its masks): it serves
        // later outputs that fit.
        if (outgrown) free_outputs_.give(outgrown, -1, outgrown->memory.size());
      }
      std::memcpy(mask_segment_->memory.data(), options.mask.data(), bytes);
      body->set_has_mask(true);
      body->set_mask_segment_id(mask_segment_->id);
      body->set_mask_offset(0);
      body->set_mask_count(options.mask.size());
    }
    if (options.allgather) {
      // The outputs live where the tensors do: a device set's in device memory on its GPU.
      const uint64_t bytes = std::max<uint64_t>(64, set.packed_bytes_ * static_cast<uint64_t>(set.world_size_));
      body->set_has_gather_output(true);
      body->set_gather_offset(0);
      if (tensors[0].device() >= 0) {
        DeviceSegment& out = device_output_segment(tensors[0].device(), bytes);
        body->set_gather_segment_id(out.id);
        set.gather_base_ = out.memory->data();
        set.gather_device_ = tensors[0].device();
        gather_device_segment = &out;
      } else {
        Segment& out = output_segment(bytes);
        body->set_gather_segment_id(out.id);
        set.gather_base_ = out.memory.data();
        gather_segment = &out;
      }
    }
    asked = true;
    reply = connection_->call(request, barrier_bound(timeout_));
  } catch (const Refused&) {
    give_back_outputs();
    throw;
  } catch (...) {
    if (!asked) give_back_outputs();
    throw;
  }
  set.tensors_.assign(tensors.begin(), tensors.end());
  for (const auto& info : reply.register_().buckets()) {
    BucketInfo bucket;
    bucket.dtype = static_cast<DType>(info.dtype());
    bucket.tensors.assign(info.tensors().begin(), info.tensors().end());
    bucket.bytes = info.bytes();
    bucket.zero_copy = info.zero_copy();
    set.buckets_.push_back(std::move(bucket));
  }
  RegisteredSet kept;
  kept.size = set.tensors_.size();
  kept.name = set_name(set.id_, set.label_);
  kept.has_integers = std::any_of(set.tensors_.begin(), set.tensors_.end(),
                                  [](const SharedTensor& t) { return !dtype_is_floating(t.dtype()); });
  for (const SharedTensor& t : set.tensors_) {
    if (t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16) kept.halves.insert(t.dtype());
  }
  kept.wire_compressible = std::all_of(set.tensors_.begin(), set.tensors_.end(), [](const SharedTensor& t) {
    return t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16;
  });
  if (tensors[0].device() >= 0) {
    // The daemon made this set's event rings (DESIGN.md decision 7); open them here.
    const auto& r = reply.register_();
    std::unique_ptr<DeviceEvents> events;
    throw_if_error(device_memory_->open_events(tensors[0].device(),
                                               std::vector<std::string>(r.ready_events().begin(), r.ready_events().end()),
                                               std::vector<std::string>(r.done_events().begin(), r.done_events().end()),
                                               &events));
    kept.events = std::move(events);
  }
  for (const SharedTensor& t : tensors) kept.segments.insert(t.segment_id());
  kept.outputs = {gather_segment, shard_segment(set)};
  kept.device_outputs = {gather_device_segment, shard_device_segment(set)};
  per_join_.sets[set.id_] = std::move(kept);
  return set;
}

void ClientImpl::release(const TensorSet& set) {
  require_joined("releasing a set");
  // A device set's Works hold its event rings (shared with them), and the daemon keeps the
  // events they were opened from until this client leaves: a Work outliving the release is safe.
  if (registered(set).deferred) {
    throw Error(Status::invalid_argument(name_of(set.id()) +
                                         " has a deferred allreduce whose tensors are not all marked ready"));
  }
  control::Request request;
  request.mutable_release()->set_set_id(set.id());
  connection_->call(request, options_.request_timeout);
  // Its host outputs serve later sets: a program that keeps registering and releasing sets of
  // new sizes holds the largest it needed at once, not the sum. (So a released set's gathered()
  // and shard() may show a later set's results: read them before releasing.)
  for (Segment* output : per_join_.sets.at(set.id()).outputs) {
    if (output) free_outputs_.give(output, -1, output->memory.size());
  }
  for (DeviceSegment* output : per_join_.sets.at(set.id()).device_outputs) {
    if (output) free_device_outputs_.give(output, output->memory->device(), output->memory->size());
  }
  per_join_.sets.erase(set.id());
  per_join_.released.insert(set.id());
  set.released_->store(true);
  trim_outputs();
}

void ClientImpl::free_memory(const SharedTensor& tensor) {
  const uint32_t id = tensor.segment_id();
  const std::string what = "free_memory: segment " + std::to_string(id);
  if (!allocated_.contains(id)) {
    throw Error(Status::invalid_argument(what + " is not memory this client's allocate calls made (or it was freed "
                                         "already); share_device's memory is the caller's, released when the client "
                                         "goes"));
  }
  for (const auto& [set_id, set] : per_join_.sets) {
    if (set.segments.contains(id)) {
      throw Error(Status::invalid_argument(what + " holds tensors of " + set.name + ", which is registered: release "
                                           "it first"));
    }
  }
  drop_segment(id);  // the daemon's refusal throws, naming why
  allocated_.erase(id);
}

void ClientImpl::drop_segment(uint32_t id, bool synchronize) {
  control::Request request;
  request.mutable_free_segment()->set_segment_id(id);
  connection_->call(request, options_.request_timeout);
  if (synchronize) {
    for (const DeviceSegment& s : device_segments_) {
      if (s.id == id) throw_if_error(s.memory->synchronize());
    }
  }
  // The daemon has unmapped it: now this side (the mapping, or the device allocation).
  std::erase_if(segments_, [id](const std::unique_ptr<Segment>& s) { return s->id == id; });
  device_segments_.remove_if([id](const DeviceSegment& s) { return s.id == id; });
}

bool ClientImpl::free_segment(uint32_t id, bool synchronize) {
  try {
    drop_segment(id, synchronize);
    return true;
  } catch (const Error& e) {
    // Still held by a set the other local clients have not released yet, or by the daemon's
    // GPU work and NCCL registration (or a daemon that predates FreeSegment, which answers it as
    // an unknown request, or an older one, which refuses to free device memory): kept.
    if (e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kNotSupported) return false;
    throw;
  }
}

void ClientImpl::trim_outputs() {
  // A few outputs stay for the next sets of the sizes just released; the older ones go back to
  // the daemon, oldest first. One the daemon still holds stays, for a later release to retry
  // (the daemon lets go of a set once every local client released it, and of device memory once
  // the GPU is through it and NCCL's registration is undone).
  constexpr size_t kKeptOutputs = 8;
  // A device output may still be read by a kernel the caller queued after the operation's done
  // event (device order): its device is synchronised before the client unmaps it.
  auto trim = [this](auto& pool, bool synchronize) {
    int device = -1;
    size_t bytes = 0;
    while (auto* oldest = pool.take_oldest_beyond(kKeptOutputs, &device, &bytes)) {
      if (!free_segment(oldest->id, synchronize)) {
        pool.keep_oldest(oldest, device, bytes);
        break;
      }
    }
  };
  trim(free_outputs_, false);
  trim(free_device_outputs_, true);
}

ClientImpl::Segment& ClientImpl::output_segment(size_t bytes) {
  Segment* kept = free_outputs_.take(-1, bytes);
  return kept ? *kept : new_segment(bytes);
}

ClientImpl::DeviceSegment* ClientImpl::shard_device_segment(const TensorSet& set) {
  if (set.shard_base_ == nullptr) return nullptr;
  for (DeviceSegment& segment : device_segments_) {
    if (segment.id == set.shard_segment_ && segment.memory->data() == set.shard_base_) return &segment;
  }
  return nullptr;
}

ClientImpl::Segment* ClientImpl::shard_segment(const TensorSet& set) {
  if (set.shard_base_ == nullptr) return nullptr;  // a device shard's id is not among these
  for (const auto& segment : segments_) {
    if (segment->id == set.shard_segment_) return segment.get();
  }
  return nullptr;
}

void ClientImpl::check_mask(const RegisterOptions& options, std::span<const SharedTensor> tensors) const {
  // The daemon checks the same (registration_check.cc, job.cc); checked here too, to fail
  // before any memory is made, naming the index.
  const std::vector<uint64_t>& mask = options.mask;
  if (options.reduce_scatter) {
    throw Error(Status::invalid_argument("mask: a masked set cannot have a reduce-scatter output (a shard of a "
                                         "masked range is not offered); register the two separately"));
  }
  uint64_t elements = 0;
  for (const SharedTensor& t : tensors) elements += t.numel();
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] >= elements) {
      throw Error(Status::invalid_argument("mask: index " + std::to_string(i) + " is " + std::to_string(mask[i]) +
                                           ", past the set's " + std::to_string(elements) + " elements"));
    }
    if (i > 0 && mask[i] <= mask[i - 1]) {
      throw Error(Status::invalid_argument("mask: index " + std::to_string(i) + " (" + std::to_string(mask[i]) +
                                           ") does not follow index " + std::to_string(i - 1) + " (" +
                                           std::to_string(mask[i - 1]) + "); the indices must be strictly increasing"));
    }
  }
}

void ClientImpl::reserve_shard(std::span<const SharedTensor> tensors, control::RegisterRequest* body,
                               TensorSet* set) {
  // The daemon checks the same (registration_check.cc); checked here too, so that the mistake
  // names the tensor before any memory is made.
  const auto group_of = [](const SharedTensor& t) { return t.group().empty() ? std::string("dp") : t.group(); };
  uint64_t elements = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].dtype() != tensors[0].dtype() || group_of(tensors[i]) != group_of(tensors[0])) {
      throw Error(Status::invalid_argument(
          "reduce_scatter: tensor " + std::to_string(i) + " is " + std::string(dtype_name(tensors[i].dtype())) +
          " in group '" + tensors[i].group() + "' but tensor 0 is " + std::string(dtype_name(tensors[0].dtype())) +
          " in group '" + tensors[0].group() + "'; a reduce-scatter set has one dtype and one process group"));
    }
    elements += tensors[i].numel();
  }
  std::vector<int> ranks;
  const std::string group = group_of(tensors[0]);
  if (group == "dp") {
    for (int r = 0; r < joined_->world_size; ++r) ranks.push_back(r);
  } else {
    for (const GroupSpec& spec : joined_->groups) {
      if (spec.name == group) ranks = spec.ranks;
    }
    std::sort(ranks.begin(), ranks.end());
  }
  const auto at = std::find(ranks.begin(), ranks.end(), joined_->rank);
  const ShardRange shard =
      at == ranks.end() ? ShardRange{} : shard_of(elements, ranks.size(), static_cast<uint64_t>(at - ranks.begin()));
  const uint64_t bytes = std::max<uint64_t>(64, shard_capacity(elements, ranks.size()) * dtype_size(tensors[0].dtype()));
  body->set_has_shard_output(true);
  body->set_shard_offset(0);
  // The output lives where the tensors do: a device set's in device memory on its GPU.
  if (tensors[0].device() >= 0) {
    DeviceSegment& out = device_output_segment(tensors[0].device(), bytes);
    body->set_shard_segment_id(out.id);
    set->shard_base_ = out.memory->data();
  } else {
    Segment& out = output_segment(bytes);
    body->set_shard_segment_id(out.id);
    set->shard_base_ = out.memory.data();
  }
  set->shard_segment_ = body->shard_segment_id();
  set->shard_first_ = shard.first;
  set->shard_count_ = shard.count;
}

ClientImpl::RegisteredSet& ClientImpl::registered(const TensorSet& set) {
  return const_cast<RegisteredSet&>(std::as_const(*this).registered(set));
}

const ClientImpl::RegisteredSet& ClientImpl::registered(const TensorSet& set) const {
  const auto it = per_join_.sets.find(set.id());
  if (set.incarnation_ == incarnation_ && per_join_.released.count(set.id())) {
    throw Error(Status::invalid_argument(set_name(set.id(), set.label()) + " was released"));
  }
  if (set.incarnation_ != incarnation_ || it == per_join_.sets.end()) {
    throw Error(Status::invalid_argument(set_name(set.id(), set.label()) +
                                         " is not registered in the current job incarnation"));
  }
  return it->second;
}

SubmitEntry ClientImpl::op_entry(OpKind kind, const TensorSet& set) const {
  require_joined("submitting operations");
  if (registered(set).deferred) {
    throw Error(Status::invalid_argument(name_of(set.id()) +
                                         " has a deferred allreduce whose tensors are not all marked ready"));
  }
  SubmitEntry entry;
  entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
  entry.set_id = set.id();
  entry.op = static_cast<uint32_t>(kind);
  entry.flags = kSubmitAllReady;
  return entry;
}

void ClientImpl::fill_reduce(SubmitEntry* entry, const ReduceOptions& options) const {
  entry->reduce_op = static_cast<uint32_t>(wire(options.op));
  if (options.op == ReduceOp::kAvg) {
    // Checked here too, so that a plain mistake fails this call instead of the whole job.
    const auto it = per_join_.sets.find(entry->set_id);
    if (it != per_join_.sets.end() && it->second.has_integers) {
      throw Error(Status::invalid_argument("avg is not defined for integer tensors, and " + name_of(entry->set_id) +
                                           " has some; use sum"));
    }
    entry->scaling = static_cast<uint32_t>(options.scaling == Scaling::kBefore ? WireScaling::kBefore : WireScaling::kAfter);
    if (!(options.divisor >= 0) || !std::isfinite(options.divisor)) {
      throw Error(Status::invalid_argument("divisor must be positive and finite (0 means the world size), got " +
                                           std::to_string(options.divisor)));
    }
    entry->divisor = options.divisor;
  } else if (options.divisor != 0) {
    throw Error(Status::invalid_argument("a divisor applies only to ReduceOp::kAvg"));
  }
  if (!options.fp32_accumulate) entry->flags |= kSubmitNarrowAccumulate;
  if (options.health) {
    // The daemon checks the same; a mistake here fails this call rather than the job.
    if (entry->op != static_cast<uint32_t>(OpKind::kAllreduce)) {
      throw Error(Status::invalid_argument("ReduceOptions::health is computed for allreduce only"));
    }
    const auto it = per_join_.sets.find(entry->set_id);
    if (it != per_join_.sets.end() && it->second.has_integers) {
      throw Error(Status::invalid_argument("ReduceOptions::health: " + name_of(entry->set_id) +
                                           " has integer tensors, which hold no inf or NaN; ask for it on "
                                           "floating-point sets only"));
    }
    entry->flags |= kSubmitHealth;
  }
  if (options.wire_dtype) {
    const auto it = per_join_.sets.find(entry->set_id);
    if (*options.wire_dtype != DType::kBFloat16 && *options.wire_dtype != DType::kFloat16) {
      throw Error(Status::invalid_argument("ReduceOptions::wire_dtype must be bfloat16 or float16, not " +
                                           std::string(dtype_name(*options.wire_dtype))));
    }
    if (it != per_join_.sets.end() && !it->second.wire_compressible) {
      throw Error(Status::invalid_argument("ReduceOptions::wire_dtype applies to float32, float16 and bfloat16, and " +
                                           name_of(entry->set_id) + " has tensors of other dtypes"));
    }
    if (it != per_join_.sets.end()) {
      // A half-precision tensor crosses in its own type or as float32, never as the other half
      // type (the daemon's check_op says why, and checks the same).
      const DType other = *options.wire_dtype == DType::kBFloat16 ? DType::kFloat16 : DType::kBFloat16;
      if (it->second.halves.contains(other)) {
        throw Error(Status::invalid_argument(
            "ReduceOptions::wire_dtype: " + name_of(entry->set_id) + " has " + std::string(dtype_name(other)) +
            " tensors, which cannot cross nodes as " + std::string(dtype_name(*options.wire_dtype)) +
            (other == DType::kFloat16 ? " (bfloat16 rounds float16's largest values, 65504, up past its range)"
                                      : " (float16 overflows bfloat16's values above 65504 and flushes its smallest)") +
            "; use their own type or no wire dtype"));
      }
      if (!it->second.halves.empty() && !options.fp32_accumulate) {
        throw Error(Status::invalid_argument("ReduceOptions::wire_dtype: " + name_of(entry->set_id) +
                                             " has half-precision tensors, which need fp32_accumulate = true "
                                             "(the wire narrows float32 sums)"));
      }
    }
    if (it != per_join_.sets.end() && it->second.events && entry->op == static_cast<uint32_t>(OpKind::kReduceScatter)) {
      throw Error(Status::not_supported("ReduceOptions::wire_dtype: " + name_of(entry->set_id) +
                                        " is in device memory, where a reduce-scatter is not compressed yet "
                                        "(allreduce and reduce are)"));
    }
    entry->flags |= *options.wire_dtype == DType::kBFloat16 ? kSubmitWireBFloat16 : kSubmitWireFloat16;
  }
}

void ClientImpl::push(const SubmitEntry& entry) {
  // The clock is read only when the ring is full: a push is on mark_ready's per-tensor path.
  std::optional<std::chrono::steady_clock::time_point> deadline_storage;
  while (!submit_->try_push(entry)) {
    if (!deadline_storage) deadline_storage = std::chrono::steady_clock::now() + timeout_;
    const auto deadline = *deadline_storage;
    throw_if_error(completions_->job_failure());
    // The daemon drains the ring continuously; a full ring means it is busy or stuck.
    const bool space = submit_->space().wait_until([&] { return !submit_->full(); },
                                                   std::min(deadline, std::chrono::steady_clock::now() +
                                                                          std::chrono::milliseconds(100)));
    if (!space && std::chrono::steady_clock::now() >= deadline) {
      throw Error(Status::timeout("the submission ring stayed full for " + std::to_string(timeout_.count()) + " ms"));
    }
  }
  channel_->doorbell_page()->doorbell.notify();
}

void ClientImpl::ready_on_device(uint32_t set_id, uint64_t seq, void* stream) {
  const auto it = per_join_.sets.find(set_id);
  if (it != per_join_.sets.end() && it->second.events) throw_if_error(it->second.events->record_ready(seq, stream));
}

void ClientImpl::abort(const std::string& why) {
  // Only the connection is touched: it lives as long as the client and is safe from any
  // thread, while join() replaces the completions under a caller's feet. Waiters learn of it
  // from the completions' liveness check (daemon_gone in join()), within kLivenessInterval.
  connection_->shut_down(Status::aborted("this client was aborted" + (why.empty() ? std::string() : ": " + why)));
}

Work ClientImpl::submit(const SubmitEntry& original, uint64_t bytes) {
  if (std::optional<Status> why = connection_->shut_down_reason()) throw Error(*why);
  throw_if_error(completions_->job_failure());
  const auto found = per_join_.sets.find(original.set_id);
  std::shared_ptr<DeviceEvents> events = found != per_join_.sets.end() ? found->second.events : nullptr;
  const bool device = events != nullptr;
  // A device set's event slot is reused every kDeviceEventsPerDirection operations: the one
  // that used it last must have been answered (so the daemon's waits on it are queued).
  completions_->wait_below(device ? kDeviceEventsPerDirection : CompletionRing::capacity,
                           std::chrono::steady_clock::now() + timeout_);
  SubmitEntry entry = original;
  entry.op_seq = per_join_.next_seq;
  // Tensors announced ready must be written: the daemon's stream waits for this record. A
  // failure here consumes no sequence number.
  if (entry.flags & kSubmitAllReady) ready_on_device(entry.set_id, entry.op_seq, stream_);
  per_join_.next_seq++;
  auto result = (entry.flags & kSubmitHealth) ? std::make_shared<OpResult>() : nullptr;
  completions_->expect(entry.op_seq, bytes <= Completions::kLatencyBoundBytes, result);
  push(entry);
  return Work(completions_, entry.op_seq, std::move(events), std::move(result));
}

Work ClientImpl::allreduce(const TensorSet& set, const ReduceOptions& options) {
  SubmitEntry entry = op_entry(OpKind::kAllreduce, set);
  fill_reduce(&entry, options);
  return submit(entry, set.packed_bytes_);
}

Work ClientImpl::allreduce_deferred(const TensorSet& set, const ReduceOptions& options) {
  SubmitEntry entry = op_entry(OpKind::kAllreduce, set);
  fill_reduce(&entry, options);
  entry.flags &= ~kSubmitAllReady;
  Work work = submit(entry, set.packed_bytes_);
  registered(set).deferred = Deferred{work.seq(), std::vector<bool>(set.size(), false), set.size()};
  return work;
}

void ClientImpl::mark_ready(const TensorSet& set, uint32_t tensor_index, void* stream) {
  require_joined("submitting operations");
  if (std::optional<Status> why = connection_->shut_down_reason()) throw Error(*why);
  RegisteredSet& kept = registered(set);
  if (!kept.deferred) throw Error(Status::invalid_argument(kept.name + " has no deferred allreduce open"));
  Deferred& deferred = *kept.deferred;
  if (tensor_index >= set.size()) {
    throw Error(Status::invalid_argument("tensor index " + std::to_string(tensor_index) + " is out of range; " +
                                         name_of(set.id()) + " has " + std::to_string(set.size()) + " tensors"));
  }
  if (deferred.marked[tensor_index]) {
    throw Error(Status::invalid_argument("tensor " + std::to_string(tensor_index) + " is already marked ready"));
  }
  throw_if_error(completions_->job_failure());
  ready_on_device(set.id(), deferred.seq, stream);
  SubmitEntry entry;
  entry.kind = static_cast<uint32_t>(SubmitKind::kMarkReady);
  entry.set_id = set.id();
  entry.op_seq = deferred.seq;
  entry.tensor_index = tensor_index;
  push(entry);
  deferred.marked[tensor_index] = true;
  if (--deferred.left == 0) kept.deferred.reset();
}

Work ClientImpl::broadcast(const TensorSet& set, int root) {
  SubmitEntry entry = op_entry(OpKind::kBroadcast, set);
  entry.root = root;
  return submit(entry, set.packed_bytes_);
}

Work ClientImpl::reduce(const TensorSet& set, int root, const ReduceOptions& options) {
  SubmitEntry entry = op_entry(OpKind::kReduce, set);
  fill_reduce(&entry, options);
  entry.root = root;
  return submit(entry, set.packed_bytes_);
}

Work ClientImpl::allgather(const TensorSet& set) {
  SubmitEntry entry = op_entry(OpKind::kAllgather, set);
  if (!set.gather_base_) {
    throw Error(Status::invalid_argument(name_of(set.id()) + " was registered without RegisterOptions::allgather"));
  }
  return submit(entry, set.packed_bytes_);
}

Work ClientImpl::reduce_scatter(const TensorSet& set, const ReduceOptions& options) {
  SubmitEntry entry = op_entry(OpKind::kReduceScatter, set);
  if (!set.shard_base_) {
    throw Error(Status::invalid_argument(name_of(set.id()) + " was registered without RegisterOptions::reduce_scatter"));
  }
  fill_reduce(&entry, options);
  return submit(entry, set.packed_bytes_);
}

void TensorSet::check_outputs_kept() const {
  if (released_->load()) {
    throw Error(Status::invalid_argument(set_name(id_, label_) + " was released: its allgather and shard outputs "
                                         "serve later sets or were freed (read them before releasing)"));
  }
}

SharedTensor TensorSet::shard() const {
  check_outputs_kept();
  if (!shard_base_) {
    throw Error(
        Status::invalid_argument(set_name(id_, label_) + " was registered without RegisterOptions::reduce_scatter"));
  }
  const SharedTensor& first = tensors_.at(0);
  return SharedTensor(first.dtype(), shard_count_, first.group(), shard_base_, shard_segment_, 0, first.device());
}

SharedTensor TensorSet::gathered(int rank, size_t i) const {
  check_outputs_kept();
  if (!gather_base_) {
    throw Error(Status::invalid_argument(set_name(id_, label_) + " was registered without RegisterOptions::allgather"));
  }
  if (rank < 0 || rank >= world_size_) {
    throw Error(Status::invalid_argument("rank " + std::to_string(rank) + " is outside world size " +
                                         std::to_string(world_size_)));
  }
  const SharedTensor& t = tensors_.at(i);
  const uint64_t offset = static_cast<uint64_t>(rank) * packed_bytes_ + packed_offset_[i];
  return SharedTensor(t.dtype(), t.numel(), t.group(), gather_base_ + offset, 0, offset, gather_device_);
}

}  // namespace gradsync
