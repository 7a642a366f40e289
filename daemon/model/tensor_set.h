// A tensor set as the daemon executes it: the layout every local client registered, its bucket
// plan, and where each client's tensors live in the daemon's mappings. Built once when the last
// local client registers the set, then immutable and shared with the job's worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shared/set_name.h"
#include "shared/shard.h"
#include "daemon/plan/planner.h"
#include "daemon/model/memory.h"
#include "daemon/model/topology.h"

namespace gradsync {

// A stretch of a bucket that is contiguous in every client's memory, with the same relative
// arrangement in all of them, so it can be reduced as one array. A bucket whose tensors are
// views of one flat buffer is a single run: the zero-copy case.
struct BucketRun {
  uint64_t elements = 0;
  std::vector<std::byte*> address;  // per local rank
};

struct TensorSet {
  uint32_t id = 0;
  std::string label;  // RegisterOptions::label of its first local rank
  // "DDP bucket 3 (set 0)", or "set 0" without a label: how every message names the set.
  std::string name() const { return set_name(id, label); }
  std::vector<plan::TensorLayout> layout;
  uint64_t bucket_cap = 0;
  plan::Plan plan;
  std::vector<std::vector<std::byte*>> address;  // [local rank][tensor]
  std::vector<std::vector<BucketRun>> runs;      // [bucket]
  // Local ranks taking part in each bucket: the members of the bucket's process group. The
  // other local ranks' tensors of that bucket are left untouched.
  std::vector<std::vector<uint32_t>> participants;  // [bucket]
  // Element offset of each tensor within its bucket, with the bucket's tensors in registration
  // order: the canonical layout of a bucket buffer that crosses nodes, the same on every node.
  std::vector<uint64_t> offset_in_bucket;  // [tensor]
  std::vector<uint64_t> bucket_elements;   // [bucket]
  // The bucket is one run laid out exactly in canonical order in every client (a flat buffer
  // registered in order), so a cross-node collective can work in the clients' memory directly.
  std::vector<bool> canonical_run;  // [bucket]
  // allgather: tensor t of rank r lands at gather_output[client] + r * packed_bytes +
  // packed_offset[t]. gather_output is empty when the set was registered without it.
  std::vector<uint64_t> packed_offset;
  uint64_t packed_bytes = 0;
  std::vector<std::byte*> gather_output;  // per local rank
  // reduce-scatter (shared/shard.h): the set's tensors in registration order form one flat range
  // of flat_elements elements, tensor t starting at flat_offset[t]; the local rank at position
  // shard_index[c] of the group (-1: not a member) gets its shard at shard_output[c]. A set with
  // a shard output has one dtype and one group (checked at registration); shard_output is
  // empty when the set was registered without it.
  std::vector<uint64_t> flat_offset;  // [tensor]
  uint64_t flat_elements = 0;
  uint64_t shard_group_size = 0;          // W: the group's ranks, on every node
  uint64_t shard_capacity = 0;            // elements every shard has room for
  std::vector<std::byte*> shard_output;   // per local rank
  std::vector<int> shard_index;           // per local rank
  // Fused health (reduce/health.h): tensor t's health blocks start at health_block[t] of the
  // set's health_blocks, in registration order.
  std::vector<uint64_t> health_block;  // [tensor]
  uint64_t health_blocks = 0;
  // Masked reduction (seeds S09): the elements of the flat range (flat_offset) that reductions
  // keep, strictly increasing, as every local rank registered them; null for a set without a
  // mask. kept[b] is bucket b's share of them as canonical positions (offset_in_bucket),
  // increasing: the order in which the kept elements are gathered and cross nodes.
  // mask_digest fingerprints the mask, for nodes to compare (set once when the set is built:
  // a replan recomputes only `kept`).
  std::shared_ptr<const std::vector<uint64_t>> mask;
  std::vector<std::vector<uint64_t>> kept;  // [bucket]
  uint64_t mask_digest = 0;
  bool masked() const { return mask != nullptr; }
  // Elements of bucket b that a reduction combines and carries across nodes: the kept ones of
  // a masked set, else all of them.
  uint64_t reduced_elements(size_t b) const { return masked() ? kept[b].size() : bucket_elements[b]; }
  // Local rank c's shard, as a flat range; empty for a rank outside the group.
  ShardRange shard(uint32_t local_rank) const;
  // The regions the addresses point into; they outlive any use by the worker.
  std::vector<std::shared_ptr<const MemoryRegion>> regions;
  // The kind of every region: it picks the set's executor.
  MemoryKind memory_kind = MemoryKind::kHostMemfd;
  // Device sets: each local rank's interprocess event rings (the CUDA executor waits on the
  // ready ring before reading a client's tensors and records the done ring after writing them).
  // Empty for host sets.
  std::vector<std::shared_ptr<const ClientEvents>> events;  // [local rank]
};

// A stretch of one tensor that lands in one shard: elements [first, first + count) of tensor
// `tensor` go to elements [at, at + count) of the shard.
struct ShardPiece {
  uint32_t tensor = 0;
  uint64_t first = 0;
  uint64_t count = 0;
  uint64_t at = 0;
};

// The pieces of bucket `bucket` that land in local rank `local_rank`'s shard, in tensor order;
// none for a rank outside the group or a set without a shard output.
std::vector<ShardPiece> shard_pieces(const TensorSet& set, size_t bucket, uint32_t local_rank);

// A reduce-scatter across nodes: how many of bucket `bucket`'s elements fall in the shards of
// each of its group's nodes, in Topology::nodes_of order. Canonical order follows the flat range
// and a node's ranks own consecutive shards, so each node's elements are one stretch of the
// bucket, node after node: the parts the engine's reduce_scatter takes. They add up to
// bucket_elements[bucket]; every node computes the same from the layout it checked.
std::vector<uint64_t> node_parts(const TensorSet& set, size_t bucket, const Topology& topology);

// Whether a reduce-scatter bucket with these node parts crosses as its parts (the engine's
// reduce_scatter: node j receives (N - 1) x parts[j] and sends the bucket less its own part)
// rather than as an allreduce (a ring: every node sends and receives 2 (N - 1) / N of the
// bucket). As parts it moves half the bytes in all, but a bucket that falls mostly in one
// node's shards would have every other node send that node the whole bucket: so only when no
// node receives more than the ring would give it, max(parts) <= 2 x bucket / N (any bucket on
// 2 nodes; an even split on any number). Buckets smaller than a node's share (the default cap
// on a large set) mostly fall in one node's shards, and cross as an allreduce.
bool node_parts_even(const std::vector<uint64_t>& parts);

// Splits every bucket into runs and fills offset_in_bucket and bucket_elements. `address`
// must already be filled.
void build_runs(TensorSet* set);

// A 64-bit FNV-1a hash of a mask's indices: what nodes compare.
uint64_t mask_digest(const std::vector<uint64_t>& mask);

// Derives everything else from id, layout, bucket_cap, address, gather_output, shard_output
// and mask (but mask_digest, which the builder sets): the plan, each bucket's participants (the members of its group on this node),
// the packed allgather offsets, the flat offsets and shard positions, the runs and the
// buckets' kept elements.
void complete_tensor_set(TensorSet* set, const Topology& topology);

}  // namespace gradsync
