// The layout of a job's channel: one shared-memory segment per job, created by the daemon and
// mapped by each local client. It holds the per-step path: for every local rank a submission
// ring (client -> daemon) and a completion ring (daemon -> client), plus the doorbell the job's
// worker sleeps on. Nothing on the per-step path uses the socket or protobuf.
//
// Trust: every client of a job can write the whole segment, so a client can disturb only its own
// job. The daemon copies each entry out before validating it and treats impossible indices as a
// protocol error of the ring's owner (see SpscRing).
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>

#include "shared/ring.h"
#include "shared/wake_word.h"

namespace gradsync {

inline constexpr uint32_t kChannelMagic = 0x67734348;  // "gsCH"
inline constexpr uint32_t kChannelVersion = 1;

enum class SubmitKind : uint32_t { kOp = 1, kMarkReady = 2 };
enum class OpKind : uint32_t { kAllreduce = 1, kBroadcast = 2, kAllgather = 3, kReduce = 4 };
enum class WireReduceOp : uint32_t { kSum = 1, kAvg = 2, kMin = 3, kMax = 4 };
enum class WireScaling : uint32_t { kAfter = 1, kBefore = 2 };

inline constexpr uint32_t kSubmitAllReady = 1u << 0;           // every tensor is ready now
inline constexpr uint32_t kSubmitNarrowAccumulate = 1u << 1;   // half types: no fp32 accumulation

// One entry of a submission ring. op_seq numbers a client's operations 1, 2, 3, ...; the n-th
// operation of every local client must describe the same collective.
struct SubmitEntry {
  uint32_t kind = 0;          // SubmitKind
  uint32_t set_id = 0;        // the registered tensor set the operation covers
  uint64_t op_seq = 0;
  uint32_t op = 0;            // OpKind (kOp)
  uint32_t reduce_op = 0;     // WireReduceOp (allreduce, reduce)
  uint32_t scaling = 0;       // WireScaling (avg)
  int32_t root = 0;           // root rank (broadcast, reduce)
  double divisor = 0;         // avg divisor; 0 means the group size
  uint32_t flags = 0;         // kSubmit* bits (kOp)
  uint32_t tensor_index = 0;  // registration index within the set (kMarkReady)
  uint8_t reserved[16] = {};
};
static_assert(sizeof(SubmitEntry) == 64);

inline constexpr size_t kCompletionMessageBytes = 240;

// One entry of a completion ring: the outcome of one operation for this client.
struct CompletionEntry {
  uint64_t op_seq = 0;
  uint32_t code = 0;  // ErrorCode; 0 is success
  uint32_t message_length = 0;
  char message[kCompletionMessageBytes] = {};
};
static_assert(sizeof(CompletionEntry) == 256);

using SubmitRing = SpscRing<SubmitEntry, 4096>;
using CompletionRing = SpscRing<CompletionEntry, 256>;

struct ClientChannel {
  SubmitRing submit;
  CompletionRing completion;
  alignas(64) WakeWord completion_ready;  // the client sleeps on it
};

struct ChannelHeader {
  uint32_t magic = kChannelMagic;
  uint32_t version = kChannelVersion;
  uint32_t local_world_size = 0;
  uint32_t reserved = 0;
  alignas(64) WakeWord doorbell;  // the job's worker sleeps on it; clients ring it after submitting
  // The job's sticky error. The daemon writes the message, then the code (release); a client
  // that reads a non-zero code (acquire) fails every pending and later operation with it,
  // even if the daemon's worker is gone.
  alignas(64) std::atomic<uint32_t> failure_code{0};
  char failure_message[512] = {};
};

inline size_t channel_bytes(uint32_t local_world_size) {
  return sizeof(ChannelHeader) + size_t{local_world_size} * sizeof(ClientChannel);
}

// The channel of local rank `local_rank` in a mapped segment.
inline ClientChannel* client_channel(void* base, uint32_t local_rank) {
  auto* first = reinterpret_cast<ClientChannel*>(static_cast<std::byte*>(base) + sizeof(ChannelHeader));
  return first + local_rank;
}

}  // namespace gradsync
