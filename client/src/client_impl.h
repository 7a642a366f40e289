// The implementation behind gradsync::Client.
#pragma once

#include <list>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/src/completions.h"
#include "client/src/connection.h"
#include "client/src/device_memory.h"
#include "client/src/output_pool.h"
#include "gradsync/client.h"
#include "shared/memfd.h"

namespace gradsync {

class ClientImpl final : public Client {
 public:
  ClientImpl(std::shared_ptr<Connection> connection, ConnectOptions options);
  ~ClientImpl() override;

  void join(const JoinOptions& options) override;
  SharedTensor allocate(const TensorSpec& spec) override;
  std::vector<SharedTensor> allocate_flat(std::span<const TensorSpec> specs) override;
  SharedTensor allocate_device(const TensorSpec& spec, int device) override;
  std::vector<SharedTensor> allocate_device_flat(std::span<const TensorSpec> specs, int device) override;
  SharedTensor share_device(const TensorSpec& spec, void* data, int device) override;
  TensorSet register_tensors(std::span<const SharedTensor> tensors, const RegisterOptions& options) override;
  void release(const TensorSet& set) override;
  void free_memory(const SharedTensor& tensor) override;
  Work allreduce(const TensorSet& set, const ReduceOptions& options) override;
  Work allreduce_deferred(const TensorSet& set, const ReduceOptions& options) override;
  void set_stream(void* stream) override { stream_ = stream; }
  void mark_ready(const TensorSet& set, uint32_t tensor_index) override { mark_ready(set, tensor_index, stream_); }
  void mark_ready(const TensorSet& set, uint32_t tensor_index, void* stream) override;
  Work broadcast(const TensorSet& set, int root) override;
  Work reduce(const TensorSet& set, int root, const ReduceOptions& options) override;
  Work allgather(const TensorSet& set) override;
  Work reduce_scatter(const TensorSet& set, const ReduceOptions& options) override;
  void abort(const std::string& why) override;
  std::chrono::milliseconds job_timeout() const override { return timeout_; }
  int world_size() const override { return joined_ ? joined_->world_size : 0; }

  // For SparseReducer's entries in device memory (not part of Client): copies device memory on
  // `device` to the host after the work queued so far on the client's stream (set_stream), and
  // waits. The Status names what failed (no CUDA here, memory of another device).
  Status copy_to_host(int device, void* to, const void* from, size_t bytes);

 private:
  struct Segment {
    Mapping memory;
    uint32_t id;
  };
  struct DeviceSegment {
    std::unique_ptr<DeviceAllocation> memory;
    uint32_t id;
  };
  // An allreduce opened with allreduce_deferred whose tensors are not all marked yet.
  struct Deferred {
    uint64_t seq = 0;
    std::vector<bool> marked;
    size_t left = 0;
  };
  // What the client keeps of one registered set.
  struct RegisteredSet {
    size_t size = 0;
    bool has_integers = false;  // an integer tensor: no avg
    bool wire_compressible = false;  // float32, float16 and bfloat16 only: wire compression applies
    std::set<DType> halves;          // its half-precision dtypes: each crosses only as itself
    std::string name;           // how messages name it (shared/set_name.h)
    // Device sets: their event rings, shared with the Work handles of their operations.
    std::shared_ptr<DeviceEvents> events;
    std::optional<Deferred> deferred;  // its open deferred allreduce
    std::vector<Segment*> outputs;      // its host allgather and shard outputs (release() reuses them)
    std::vector<DeviceSegment*> device_outputs;  // the same in device memory
    std::set<uint32_t> segments;  // where its tensors lie (free_memory refuses those)
  };
  // Everything that belongs to one job incarnation's sets and operations. A join replaces it
  // whole (assignment), so nothing of the last incarnation can be left behind.
  struct PerJoin {
    uint64_t next_seq = 1;
    uint32_t next_set_id = 0;
    std::map<uint32_t, RegisteredSet> sets;
    std::set<uint32_t> released;  // for what the refusal of an operation on one says
  };

  Segment& new_segment(size_t bytes);
  // Asks the daemon to free segment `id`, then unmaps it here; the daemon's refusal throws.
  // `synchronize`: a device segment's device is synchronised first (DeviceAllocation).
  void drop_segment(uint32_t id, bool synchronize = false);
  // drop_segment, but false, leaving it, where the daemon still holds it (a set not yet dropped
  // by every local client, or its GPU work and NCCL registration not yet through); other errors
  // throw.
  bool free_segment(uint32_t id, bool synchronize = false);
  // Frees the oldest outputs of released sets beyond a few (output_pool.h).
  void trim_outputs();
  // A host segment for a set's output: the smallest a released set left that holds `bytes`,
  // else a new one.
  Segment& output_segment(size_t bytes);
  // The host segment of the set's shard output; nullptr for none or a device one.
  Segment* shard_segment(const TensorSet& set);
  DeviceSegment* shard_device_segment(const TensorSet& set);
  // RegisterOptions::mask: strictly increasing, within the tensors' elements; throws naming the
  // first bad index.
  void check_mask(const RegisterOptions& options, std::span<const SharedTensor> tensors) const;
  DeviceSegment& new_device_segment(int device, size_t bytes);
  // A device output of `bytes` on `device`: the smallest a released set left that fits, else new.
  DeviceSegment& device_output_segment(int device, size_t bytes);
  void require_joined(const char* what) const;
  SubmitEntry op_entry(OpKind kind, const TensorSet& set) const;
  void fill_reduce(SubmitEntry* entry, const ReduceOptions& options) const;
  // `bytes`: the set's, for how the wait polls (Completions::expect).
  Work submit(const SubmitEntry& entry, uint64_t bytes);
  void push(const SubmitEntry& entry);

  std::shared_ptr<Connection> connection_;
  ConnectOptions options_;
  std::vector<std::unique_ptr<Segment>> segments_;
  OutputPool<Segment> free_outputs_;  // outputs of released sets, for the next sets' outputs
  OutputPool<DeviceSegment> free_device_outputs_;  // the same in device memory
  // Where masks travel (RegisterOptions::mask): the daemon copies them at registration, so one
  // segment serves every later mask that fits; a larger one replaces it (doubling).
  Segment* mask_segment_ = nullptr;
  // Device memory: the allocator is made on first use (it loads the CUDA driver), and outlives
  // the allocations (declared first, destroyed last).
  std::unique_ptr<DeviceMemory> device_memory_;
  std::list<DeviceSegment> device_segments_;  // a list: references stay valid as it changes
  // The segments allocate* handed out, which free_memory may free (not the library's own:
  // outputs, masks; nor share_device's, which is the caller's memory).
  std::set<uint32_t> allocated_;
  // Per job incarnation:
  std::optional<JoinOptions> joined_;
  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<JobChannel> channel_;
  std::shared_ptr<Completions> completions_;
  std::optional<RingWriter<SubmitRing>> submit_;
  uint64_t incarnation_ = 0;  // bumped by every join; sets of older joins are refused
  PerJoin per_join_;
  // The set, registered in this incarnation; throws InvalidArgument naming it otherwise.
  RegisteredSet& registered(const TensorSet& set);
  // RegisterOptions::reduce_scatter: checks the set is one dtype and group, makes the shard
  // output where the tensors live and records this rank's shard in the set.
  void reserve_shard(std::span<const SharedTensor> tensors, control::RegisterRequest* body, TensorSet* set);
  const RegisteredSet& registered(const TensorSet& set) const;
  std::string name_of(uint32_t set_id) const;
  void* stream_ = nullptr;  // set_stream(); nullptr is the legacy default stream
  // Device sets: records operation seq's ready event after the work queued on `stream`.
  void ready_on_device(uint32_t set_id, uint64_t seq, void* stream);
};

}  // namespace gradsync
