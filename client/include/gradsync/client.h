// gradsync::Client: a trainer's handle on its node's gradsyncd.
//
//   auto client = gradsync::Client::connect({});              // $GRADSYNC_SOCKET or the default
//   client->join({.job_id = "resnet", .rank = r, .world_size = n, .local_rank = r, .local_world_size = n});
//   auto grads = client->allocate_flat(specs);                 // shared memory, views of one buffer
//   auto set = client->register_tensors(grads, {});            // once; a barrier across local ranks
//   ... fill grads ...
//   client->allreduce(set).wait(std::chrono::seconds(30));     // each step
//
// Or, as autograd hooks fire: auto work = client->allreduce_deferred(set); then
// client->mark_ready(set, i) for each tensor; buckets launch as soon as every local client has
// marked all of their tensors.
//
// Errors: methods throw gradsync::Error, whose message names what was wrong. A Client is not
// thread-safe; use it from one thread (Work handles may be waited on from any thread).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gradsync/options.h"
#include "gradsync/tensor.h"
#include "gradsync/work.h"

namespace gradsync {

class Client {
 public:
  // Connects and says hello; throws Error when the daemon is unreachable or incompatible.
  static std::unique_ptr<Client> connect(const ConnectOptions& options);

  virtual ~Client() = default;

  // Joins a job. Joining again leaves the previous job (its other members see it fail) and
  // joins a new incarnation: that is how a job re-forms after a failure.
  virtual void join(const JoinOptions& options) = 0;

  // A tensor in its own shared-memory segment, zero-filled.
  virtual SharedTensor allocate(const TensorSpec& spec) = 0;

  // Tensors as views of one flat shared buffer, packed in order (each aligned to its element
  // size). Buckets of such tensors are reduced in place with no coalescing copy.
  virtual std::vector<SharedTensor> allocate_flat(std::span<const TensorSpec> specs) = 0;

  // Device memory for gradients on CUDA device `device` (this process's ordinal): a VMM
  // allocation, zero-filled, handed to the daemon once. The CUDA driver is loaded on first use,
  // so trainers that never call these need no CUDA. Throws Error naming the cause when there
  // is no CUDA support in this build, no driver, no such device, or when the daemon cannot take
  // device memory.
  virtual SharedTensor allocate_device(const TensorSpec& spec, int device) = 0;
  virtual std::vector<SharedTensor> allocate_device_flat(std::span<const TensorSpec> specs, int device) = 0;

  // Device memory some other allocator made (cudaMalloc, PyTorch's caching allocator): `data`
  // holds spec's elements on `device`. It reaches the daemon as a legacy CUDA IPC handle of its
  // allocation (opened once per allocation there, and shared by every tensor in it), so the
  // daemon must trust this user (gradsyncd --legacy-ipc-uid); otherwise it is refused with an
  // Error that says so. The memory must stay allocated until this client is destroyed (the
  // daemon keeps the allocation open until the client disconnects; freeing it first is
  // undefined behaviour in CUDA, and a fault there would hit every job on the GPU).
  // Prefer allocate_device: its buffers pass by descriptor and need no trust.
  virtual SharedTensor share_device(const TensorSpec& spec, void* data, int device) = 0;

  // Registers a set once. Blocks until every local client registered its set with the same id
  // (the n-th call on every rank), and throws a LayoutMismatch Error naming the first differing
  // tensor if their layouts differ.
  virtual TensorSet register_tensors(std::span<const SharedTensor> tensors, const RegisterOptions& options) = 0;
  // This client will not use `set` again: operations on it are refused from now on (those
  // submitted already finish), and the daemon drops it once every local client released it
  // (release in the same program order on every rank, as registrations go). Its tensors' memory
  // stays the client's.
  virtual void release(const TensorSet& set) = 0;

  // Frees the allocation `tensor` lies in (one allocate, allocate_flat, allocate_device or
  // allocate_device_flat call, with every tensor carved from it): the daemon unmaps it and
  // gives its charge back to the user's limits (--max-bytes-per-user, segment counts), then
  // this client unmaps it. Every tensor of that allocation is invalid afterwards. Throws an
  // InvalidArgument Error naming the set while a registered set of this client uses it, and
  // naming the cause for memory this client did not allocate (share_device's is the
  // caller's). The daemon drops a released set once every local client released it: until
  // then it refuses the free too (free later, or on every rank after a barrier).
  virtual void free_memory(const SharedTensor& tensor) = 0;

  // Sets in device memory are ordered on the GPU, not by the host (DESIGN.md decision 7): an
  // operation, or a mark_ready, makes the daemon's reads wait for the work queued so far on
  // the client's current stream (a cudaStream_t; nullptr, the default, is the legacy default
  // stream, which orders after every blocking stream). Work::wait_stream orders a stream after
  // the results. At most 64 operations on device sets may be outstanding; a 65th waits.
  virtual void set_stream(void* stream) = 0;

  // All tensors of the set are ready now.
  virtual Work allreduce(const TensorSet& set, const ReduceOptions& options) = 0;

  // Opens an allreduce whose tensors are marked ready one by one with mark_ready(). On a
  // device set, the tensor is ready once the work queued on `stream` so far is done (the
  // two-argument form uses the current stream).
  virtual Work allreduce_deferred(const TensorSet& set, const ReduceOptions& options) = 0;
  virtual void mark_ready(const TensorSet& set, uint32_t tensor_index) = 0;
  virtual void mark_ready(const TensorSet& set, uint32_t tensor_index, void* stream) = 0;

  // Copies the root's tensors into every rank's.
  virtual Work broadcast(const TensorSet& set, int root) = 0;

  // Reduces into the root's tensors only; other ranks' tensors are unchanged.
  virtual Work reduce(const TensorSet& set, int root, const ReduceOptions& options) = 0;

  // Gathers every rank's tensors; read them with set.gathered(rank, i).
  virtual Work allgather(const TensorSet& set) = 0;

  // Reduces the set and leaves each rank only its shard: the set's tensors, in registration
  // order, as one flat range of N elements, split over the group's W ranks (in rank order) into
  // shards of ceil(N / W) elements, the last ones shorter or empty (the ZeRO layout,
  // shared/shard.h: 6 elements over 4 ranks are 2, 2, 2, 0).
  // Read it with set.shard(); the tensors are left as they were. Requires
  // RegisterOptions::reduce_scatter.
  virtual Work reduce_scatter(const TensorSet& set, const ReduceOptions& options) = 0;

  // Leaves the job at once, from any thread (the one exception to "one thread"), also while
  // another thread waits for a Work or is in a call: the connection is shut down, so the daemon
  // ends the job (its other ranks fail with PeerLost, naming this rank) as if this process had
  // exited. Every Work not yet completed fails with Aborted naming `why` (within 100 ms), and
  // every later call on this client throws it. Memory stays mapped in this process until the
  // client is destroyed; what the daemon wrote into it after the abort is undefined. For a
  // watchdog, or torch's ProcessGroup.abort(); to leave cleanly, destroy the client instead.
  virtual void abort(const std::string& why) = 0;

  // The job's timeout as the daemon applies it.
  virtual std::chrono::milliseconds job_timeout() const = 0;
  // The job this client joined: its world size (0 before a join).
  virtual int world_size() const = 0;
};


}  // namespace gradsync
