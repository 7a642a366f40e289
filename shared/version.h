// Versions. The protocol version covers the control messages and the channel layout; a client
// and a daemon must agree on it exactly.
//   1: shared-memory names (no longer spoken)
//   2: memory and rings passed as sealed memfds over SCM_RIGHTS
//   3: device sets: the daemon makes each client's event rings and sends their handles in the
//      RegisterReply (a version-2 client would announce through events nobody waits on)
//   4: reduce-scatter (operation 5) and the shard output a RegisterRequest reserves for it (a
//      version-3 daemon would accept the registration and fail the job at the first operation)
//   5: masked sets (RegisterRequest.has_mask; a version-4 daemon would ignore the mask and
//      reduce every element)
#pragma once

#include <cstdint>

namespace gradsync {

inline constexpr const char* kGradsyncVersion = "0.2.4";
inline constexpr uint32_t kProtocolVersion = 5;

// The cross-node protocol: what the daemons of one job say to each other (the node record at
// formation, the sequence-check header, the engine calls each bucket makes, the store keys).
// Every node of a job must speak the same one; formation refuses a node that speaks another,
// naming both versions. Bump it with any change to those.
//   0: (not stated) gradsyncd before 0.2.1
//   1: the node record states it; the header carries the slice size
//   2: device sets share NCCL communicators per (group, GPU layout), agreed in a `<name>/share`
//      exchange at each set's admission; engine names length-prefix the group
//   3: the `<name>/share` offer also lists the engines a new one could be split off
//      ("<engine> <engine> ...;<engine>"), and "dp" is admitted before a set's other groups
//   4: peer-call proofs are "v2": bound to the callee's service id (from its Ping) and naming
//      the calling node, whose per-member quotas the store keeps
//   5: reduce-scatter: the header's kind 5, and the set layout states whether a set has a shard
//      output
//   6: masked sets: the layout record states the mask's count and digest, and the header its
//      digest, with the kept count as the bucket's elements
//   7: formation: node 0 publishes every node's record as one table ("nodes"), which the other
//      nodes read instead of each record; Gloo's mesh keys are read a family at a time
//   8: Gloo's mesh: node 0 publishes each other rank's column of the pair addresses
//      ("col_<s>", or "whole"), which that rank reads instead of every rank's list (a rank of
//      protocol 7 as node 0 would never publish it)
//   9: a reduce-scatter bucket whose largest node part is at most 2/N of it (node_parts_even)
//      crosses as each node's part sent to that node (Gloo's alltoallv), not as an allreduce;
//      a staged allreduce of a half-type bucket crosses in slice_bytes slices of its float32
//      sums, not in one call
inline constexpr uint32_t kCrossNodeProtocol = 9;

}  // namespace gradsync
