// Options of the client API. Defaults are what a data-parallel trainer wants.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/dtype.h"

namespace gradsync {

inline constexpr const char* kDefaultSocketPath = "/run/gradsync/gradsync.sock";

struct ConnectOptions {
  // The daemon's control socket. Empty: $GRADSYNC_SOCKET, else kDefaultSocketPath.
  std::string socket_path;
  std::string client_name = "trainer";  // shows up in the daemon's logs
  // Bound for control requests that do not wait for other clients (hello, segments).
  std::chrono::milliseconds request_timeout{10'000};
  // The client hands its memory only to a daemon that runs as root, as this process's own user,
  // or as this uid (checked with SO_PEERCRED when connecting). nullopt: $GRADSYNC_DAEMON_UID if
  // set, else root or the own user only.
  std::optional<uid_t> daemon_uid;
};

inline constexpr int kDefaultPeerPort = 29590;

// A named process group: the global ranks it spans. "dp" (every rank) always exists.
struct GroupSpec {
  std::string name;
  std::vector<int> ranks;
};

// Who this process is in the job. Ranks are node-major, as torchrun assigns them:
// rank = node * local_world_size + local_rank; world_size / local_world_size nodes.
struct JoinOptions {
  std::string job_id;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // Bound for every wait of the job (registration barrier, a step's stragglers). Zero: the
  // daemon's default (--timeout-ms).
  std::chrono::milliseconds timeout{0};
  // Multi-node jobs: HOST:PORT of the node-0 daemon's peer service, or etcd://HOST:PORT[,...]
  // (an etcd cluster; "etcd://" alone: the daemons' --etcd-endpoints). Empty:
  // $GRADSYNC_RENDEZVOUS, else $MASTER_ADDR with port kDefaultPeerPort (the torchrun convention).
  std::string rendezvous;
  // Process groups beyond "dp"; every rank of the job declares the same list.
  std::vector<GroupSpec> groups;
};

// Where a tensor belongs; layout must be identical on every rank.
struct TensorSpec {
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
  std::string group = "dp";  // process group, declared at join; "dp" is every rank
};

struct RegisterOptions {
  // Bucket cap in bytes. nullopt: 25 MiB. 0: one bucket per (group, dtype).
  std::optional<uint64_t> bucket_cap_bytes;
  // Reserve an allgather output for this set (world_size copies of its tensors).
  bool allgather = false;
  // Reserve a reduce-scatter output for this set: room for this rank's shard of the set's flat
  // elements (TensorSet::shard). The set's tensors must then share one dtype and one group.
  bool reduce_scatter = false;
  // What the set is, in its maker's words ("DDP bucket 3"): every message about the set, the
  // client's and the daemon's, names it so ("DDP bucket 3 (set 0)"). Empty: "set 0". At most
  // 128 bytes.
  std::string label;
  // Masked reduction (the seeds' pruned-model DDP): the elements that reductions keep, as
  // strictly increasing indices into the set's flat range (its tensors, in registration order,
  // as one range). allreduce and reduce then combine and send across nodes only those; every
  // other element of each result is set to zero. broadcast and allgather move every element.
  // Every rank gives the same mask. Host and device sets; not with reduce_scatter, nor with health
  // on device sets. Empty:
  // no mask. The daemon copies it at registration (8 bytes per index, kept for the set's life).
  std::vector<uint64_t> mask;
};

enum class ReduceOp { kSum, kAvg, kMin, kMax };

// When kAvg divides: after combining (the default), or before (prescale, which keeps fp16
// sums from overflowing).
enum class Scaling { kAfter, kBefore };

struct ReduceOptions {
  ReduceOp op = ReduceOp::kAvg;
  Scaling scaling = Scaling::kAfter;
  double divisor = 0;  // kAvg only; 0 means the world size
  // float16/bfloat16: accumulate in float32 and round once (DeepSpeed's fp32_allreduce).
  bool fp32_accumulate = true;
  // allreduce of a floating-point set: compute, in the same pass as the reduction (on a masked
  // host set and on device sets, in a read of the results right after they are written),
  // whether the result holds an inf or a NaN and its sum of squares, read with
  // Work::found_inf() and Work::sq_norm() (mixed precision's overflow check and the gradient
  // norm, without a second pass over the gradients in the trainer).
  bool health = false;
  // Wire compression (Horovod's fp16 compression) for sets of float32, float16 and bfloat16
  // (device sets: allreduce and reduce only): each node's float32
  // sums cross nodes as bfloat16 or float16 (half the bytes), combined in float32 at every hop
  // and rounded back; the local stages stay float32 (on device sets the hops between a node's
  // GPUs, inside NCCL, carry the half type too). Adds an error bounded in
  // docs/how-it-works.md; float16 overflows above 65504. nullopt: none. Only nodes pay; a job
  // on one node is unaffected. A float16 or bfloat16 set is carried in float32 (each sum
  // rounded once) unless its own type is given here: then it crosses at its own size, rounded
  // at each combine, as NCCL's and Gloo's sums of it are. A half tensor takes no other wire
  // type (bfloat16 rounds float16's 65504 up past its range; float16 overflows bfloat16's large
  // values), and needs fp32_accumulate. With kAvg the node sums cross before the divide: ask
  // Scaling::kBefore to keep float16 sums in range (NCCL's avg divides first too).
  std::optional<DType> wire_dtype;
};

}  // namespace gradsync
