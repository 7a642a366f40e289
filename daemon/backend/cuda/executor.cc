#include "daemon/backend/cuda/executor.h"

#include <algorithm>
#include <set>

#include "daemon/backend/cuda/work_items.h"
#include "daemon/backend/host/staged.h"

namespace gradsync::cuda {

CudaExecutor::CudaExecutor(DeviceApi* api, KernelLauncher* kernels, Logger log)
    : api_(api), kernels_(kernels), log_(std::move(log)) {}

CudaExecutor::~CudaExecutor() {
  for (auto& [key, entry] : tables_) {
    (void)api_->free(entry.first, entry.second.segments);
    (void)api_->free(entry.first, entry.second.items);
  }
  for (auto& [device, state] : devices_) {
    if (state.bucket_buffer) (void)api_->free(device, state.bucket_buffer);
    if (state.stream) (void)api_->destroy_stream(device, state.stream);
  }
}

void CudaExecutor::abort(const Status& why) {
  std::lock_guard lock(mutex_);
  if (aborted_.ok()) aborted_ = why.ok() ? Status::aborted("aborted") : why;
}

void CudaExecutor::launch(BucketCall call, BucketDone done) {
  Status status;
  {
    std::lock_guard lock(mutex_);
    status = aborted_;
  }
  if (status.ok()) status = run(call);
  done(status);
}

Status CudaExecutor::device_of(const TensorSet& set, size_t bucket, int* device) const {
  std::set<int> devices;
  for (uint32_t c : set.participants[bucket]) {
    for (uint32_t t : set.plan.buckets[bucket].tensors) {
      const std::byte* at = set.address[c][t];
      for (const auto& region : set.regions) {
        if (at >= region->base() && at < region->base() + region->size()) {
          devices.insert(region->device());
          break;
        }
      }
    }
  }
  if (devices.size() != 1 || *devices.begin() < 0) {
    std::string list;
    for (int d : devices) list += (list.empty() ? "" : " and ") + std::to_string(d);
    return Status::not_supported("bucket " + std::to_string(bucket) + " of set " + std::to_string(set.id) +
                                 " has participants on GPUs " + list +
                                 "; reducing across GPUs needs the NCCL engine, which is not built yet");
  }
  *device = *devices.begin();
  return Status();
}

Status CudaExecutor::device_state(int device, size_t bucket_bytes, Device** out) {
  Device& state = devices_[device];
  if (!state.stream) {
    if (Status s = api_->create_stream(device, &state.stream); !s.ok()) return s;
  }
  if (state.bucket_bytes < bucket_bytes) {
    if (state.bucket_buffer) (void)api_->free(device, state.bucket_buffer);
    state.bucket_buffer = nullptr;
    state.bucket_bytes = 0;
    if (Status s = api_->allocate(device, bucket_bytes, &state.bucket_buffer); !s.ok()) return s;
    state.bucket_bytes = bucket_bytes;
  }
  *out = &state;
  return Status();
}

Status CudaExecutor::table(const BucketCall& call, int device, Side side, int only, bool skip_root, bool bytes,
                           const Table** out) {
  const TensorSet& set = *call.set;
  const uint32_t root = static_cast<uint32_t>(call.desc.root % call.topology->local_world_size);
  const TableKey key{set.id, call.bucket, side, only, skip_root ? static_cast<int>(root) : -1, bytes};
  if (auto it = tables_.find(key); it != tables_.end()) {
    *out = &it->second.second;
    return Status();
  }
  const plan::Bucket& bucket = set.plan.buckets[call.bucket];
  std::vector<uint32_t> clients;
  for (uint32_t c : set.participants[call.bucket]) {
    if (only >= 0 && c != static_cast<uint32_t>(only)) continue;
    if (skip_root && c == root) continue;
    clients.push_back(c);
  }
  if (clients.size() > kMaxClientsPerDevice) {
    return Status::not_supported(std::to_string(clients.size()) + " clients share one GPU; at most " +
                                 std::to_string(kMaxClientsPerDevice) + " may");
  }
  const uint64_t unit = bytes ? dtype_size(bucket.dtype) : 1;  // a byte table counts bytes
  std::vector<Segment> segments;
  for (uint32_t t : bucket.tensors) {
    Segment s;
    s.bucket_offset = set.offset_in_bucket[t] * unit;
    s.count = set.layout[t].numel * unit;
    for (size_t k = 0; k < clients.size(); ++k) s.address[k] = set.address[clients[k]][t];
    segments.push_back(s);
  }
  const std::vector<WorkItem> items = cut_into_items(segments);
  Table table;
  table.item_count = items.size();
  table.clients = static_cast<uint32_t>(clients.size());
  Status status = api_->allocate(device, std::max<size_t>(1, segments.size()) * sizeof(Segment), &table.segments);
  if (status.ok()) status = api_->allocate(device, std::max<size_t>(1, items.size()) * sizeof(WorkItem), &table.items);
  if (status.ok()) status = api_->upload(device, table.segments, segments.data(), segments.size() * sizeof(Segment));
  if (status.ok()) status = api_->upload(device, table.items, items.data(), items.size() * sizeof(WorkItem));
  if (!status.ok()) {
    if (table.segments) (void)api_->free(device, table.segments);
    if (table.items) (void)api_->free(device, table.items);
    return status;
  }
  auto [it, inserted] = tables_.emplace(key, std::make_pair(device, table));
  *out = &it->second.second;
  return Status();
}

Status CudaExecutor::run(const BucketCall& call) {
  const TensorSet& set = *call.set;
  const size_t b = call.bucket;
  const std::string where = "bucket " + std::to_string(b) + " of set " + std::to_string(set.id);
  if (call.engine) {
    return Status::not_supported(where + " spans nodes; device memory across nodes needs the NCCL engine, which is "
                                         "not built yet");
  }
  if (call.desc.kind == OpKind::kAllgather) {
    return Status::not_supported("allgather on device memory is not supported yet (" + where + ")");
  }
  int device = -1;
  if (Status s = device_of(set, b, &device); !s.ok()) return s;
  const DType dtype = set.plan.buckets[b].dtype;
  const bool copy = call.desc.kind == OpKind::kBroadcast;  // moves bytes, not values
  const size_t acc = copy ? dtype_size(dtype) : dtype_size(reduce::accumulation_dtype(dtype));
  // Kernels launch on the device's stream from this thread.
  if (Status s = api_->make_current(device); !s.ok()) return s;
  Device* state = nullptr;
  if (Status s = device_state(device, std::max<size_t>(1, set.bucket_elements[b] * acc), &state); !s.ok()) return s;

  const int root = static_cast<int>(call.desc.root % call.topology->local_world_size);
  const Table* gather = nullptr;
  const Table* scatter = nullptr;
  Status status;
  switch (call.desc.kind) {
    case OpKind::kAllreduce:
      status = table(call, device, Side::kGather, -1, false, false, &gather);
      if (status.ok()) status = table(call, device, Side::kScatter, -1, false, false, &scatter);
      break;
    case OpKind::kReduce:
      status = table(call, device, Side::kGather, -1, false, false, &gather);
      if (status.ok()) status = table(call, device, Side::kScatter, root, false, false, &scatter);
      break;
    case OpKind::kBroadcast:
      status = table(call, device, Side::kGather, root, false, true, &gather);
      if (status.ok()) status = table(call, device, Side::kScatter, -1, true, true, &scatter);
      break;
    case OpKind::kAllgather: break;
  }
  if (!status.ok()) return Status(status.code(), where + ": " + status.message(), status.where());
  // A broadcast moves the root's bytes through the bucket buffer unchanged: as uint8, one
  // "client" in, a copy out, so even NaN payloads of the half types survive.
  reduce::KernelArgs args = call.args;
  if (copy) args = reduce::KernelArgs{.dtype = DType::kUInt8};
  const auto as_table = [&](const Table& t) {
    return BucketTable{static_cast<const Segment*>(t.segments), static_cast<const WorkItem*>(t.items), t.item_count,
                       t.clients, state->bucket_buffer};
  };
  bool enqueued = false;
  if (gather->clients > 0) {
    status = kernels_->gather(args, as_table(*gather), state->stream);
    enqueued = status.ok();
  }
  if (status.ok() && scatter->clients > 0) status = kernels_->scatter(args, as_table(*scatter), state->stream);
  // Whatever failed, nothing that was enqueued may still touch client memory once the job
  // learns of the failure and unmaps it.
  if (enqueued || status.ok()) {
    const Status synchronized = api_->synchronize(state->stream);
    if (status.ok()) status = synchronized;
  }
  if (!status.ok()) return Status(status.code(), where + " on GPU " + std::to_string(device) + ": " + status.message());
  return Status();
}

}  // namespace gradsync::cuda
