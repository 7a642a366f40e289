// The per-step path between a job's clients and the daemon: memory the daemon creates as
// memfds and hands to each client over the control socket (JoinReply, three descriptors).
//
//   DoorbellPage  one per job, shared by the job's clients: the word the job's worker sleeps
//                 on; clients ring it after submitting. Every client of the job writes it, so
//                 a client can disturb only its own job (late wake-ups, bounded by the worker's
//                 wake slice), never read or write another client's rings.
//   ClientRings   one per client, written by that client and the daemon: the submission ring
//                 and the client's cursor of its completion ring.
//   DaemonRings   one per client, written by the daemon only and sealed F_SEAL_FUTURE_WRITE
//                 before it is handed over, so the client can map it read-only and nothing
//                 else: the completion entries, the completion wake-up word and the job's
//                 sticky error. No client can forge a completion, its own or anybody's.
//
// The daemon copies each submission entry out before validating it and treats impossible
// indices as a protocol error of the ring's owner (see ring.h). Nothing on the per-step path
// uses the socket or protobuf.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shared/ring.h"
#include "shared/wake_word.h"

namespace gradsync {

inline constexpr uint32_t kChannelVersion = 3;  // 3: fused health (kSubmitHealth, results), wire compression
inline constexpr uint32_t kDoorbellMagic = 0x67734442;     // "gsDB"
inline constexpr uint32_t kClientRingsMagic = 0x67734352;  // "gsCR"
inline constexpr uint32_t kDaemonRingsMagic = 0x67734452;  // "gsDR"

enum class SubmitKind : uint32_t { kOp = 1, kMarkReady = 2 };
enum class OpKind : uint32_t { kAllreduce = 1, kBroadcast = 2, kAllgather = 3, kReduce = 4, kReduceScatter = 5 };
enum class WireReduceOp : uint32_t { kSum = 1, kAvg = 2, kMin = 3, kMax = 4 };
enum class WireScaling : uint32_t { kAfter = 1, kBefore = 2 };

inline constexpr uint32_t kSubmitAllReady = 1u << 0;           // every tensor is ready now
inline constexpr uint32_t kSubmitNarrowAccumulate = 1u << 1;   // half types: no fp32 accumulation
inline constexpr uint32_t kSubmitHealth = 1u << 2;             // allreduce: return the result's health
inline constexpr uint32_t kSubmitWireBFloat16 = 1u << 3;       // float32 across nodes as bfloat16
inline constexpr uint32_t kSubmitWireFloat16 = 1u << 4;        // float32 across nodes as float16

// One entry of a submission ring. op_seq numbers a client's operations 1, 2, 3, ...; the n-th
// operation of every local client must describe the same collective.
struct SubmitEntry {
  uint32_t kind = 0;          // SubmitKind
  uint32_t set_id = 0;        // the registered tensor set the operation covers
  uint64_t op_seq = 0;
  uint32_t op = 0;            // OpKind (kOp)
  uint32_t reduce_op = 0;     // WireReduceOp (allreduce, reduce, reduce-scatter)
  uint32_t scaling = 0;       // WireScaling (avg)
  int32_t root = 0;           // root rank (broadcast, reduce)
  double divisor = 0;         // avg divisor; 0 means the group size
  uint32_t flags = 0;         // kSubmit* bits (kOp)
  uint32_t tensor_index = 0;  // registration index within the set (kMarkReady)
  uint8_t reserved[16] = {};
};
static_assert(sizeof(SubmitEntry) == 64);

inline constexpr size_t kCompletionMessageBytes = 224;

inline constexpr uint32_t kResultHealth = 1u << 0;  // found_inf and sq_norm hold the set's health

// Interprocess events per client, device set and direction (DESIGN.md decision 7): operation
// seq uses slot seq % kDeviceEventsPerDirection, so a client keeps at most this many operations
// on a device set outstanding.
inline constexpr uint32_t kDeviceEventsPerDirection = 64;

// One entry of a completion ring: the outcome of one operation for this client. A failed
// operation always failed with the job's sticky error, whose whole text is in DaemonRings;
// `message` holds its first kCompletionMessageBytes bytes. A successful operation that asked
// for it (kSubmitHealth) carries the reduced set's health (daemon/reduce/health.h).
struct CompletionEntry {
  uint64_t op_seq = 0;
  uint32_t code = 0;  // ErrorCode; 0 is success
  uint32_t message_length = 0;
  uint32_t result_flags = 0;  // kResult* bits
  uint32_t found_inf = 0;     // 1: an element of the result is an inf or a NaN
  double sq_norm = 0;         // the result's sum of squares, in float64
  char message[kCompletionMessageBytes] = {};
};
static_assert(sizeof(CompletionEntry) == 256);

using SubmitRing = SpscRing<SubmitEntry, 4096>;
using CompletionRing = SpscRing<CompletionEntry, 256>;

struct DoorbellPage {
  uint32_t magic = kDoorbellMagic;
  uint32_t version = kChannelVersion;
  alignas(64) WakeWord doorbell;  // the job's worker sleeps on it; clients ring it after submitting
};

struct ClientRings {
  uint32_t magic = kClientRingsMagic;
  uint32_t version = kChannelVersion;
  SubmitRing submit;                                     // client -> daemon
  RingCursor completion_cursor;                          // the client's cursor of its completions
  alignas(64) std::atomic<uint32_t> completion_waiters{0};  // the waiter half of the completion wake-up
};

inline constexpr size_t kFailureMessageBytes = 4096;

struct DaemonRings {
  uint32_t magic = kDaemonRingsMagic;
  uint32_t version = kChannelVersion;
  CompletionRing::Data completion;                  // daemon -> client
  alignas(64) std::atomic<uint32_t> completion_seq{0};  // the notifier half of the completion wake-up
  // The job's sticky error. The daemon writes the message, then the code (release); a client
  // that reads a non-zero code (acquire) fails every pending and later operation with it,
  // even if the daemon's worker is gone.
  alignas(64) std::atomic<uint32_t> failure_code{0};
  uint32_t failure_length = 0;
  char failure_message[kFailureMessageBytes] = {};
};

// memfd sizes: whole pages, so that every mapping covers exactly the object.
inline constexpr size_t page_rounded(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
inline constexpr size_t kDoorbellBytes = page_rounded(sizeof(DoorbellPage));
inline constexpr size_t kClientRingsBytes = page_rounded(sizeof(ClientRings));
inline constexpr size_t kDaemonRingsBytes = page_rounded(sizeof(DaemonRings));

// The order of the descriptors in a JoinReply.
enum JoinFd : int { kJoinFdDoorbell = 0, kJoinFdClientRings = 1, kJoinFdDaemonRings = 2, kJoinFdCount = 3 };

}  // namespace gradsync
