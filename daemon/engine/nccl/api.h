// The NCCL calls the engine makes, behind an interface: the real one (nccl_api.cc) calls NCCL,
// and host tests pass a fake that fails, hangs until aborted, or stays in progress, so the
// engine's initialisation, grouping, watchdog and abort are tested without a GPU.
// Communicators and streams are opaque (void*), so this header needs neither NCCL nor CUDA.
//
// Non-blocking mode: every communicator is created with config.blocking = 0, so a call may
// leave work in progress. A call's Status is its immediate result (ok covers ncclInProgress);
// state() is how the engine learns when a communicator left ncclInProgress, or failed.
//
// Threads: a communicator is never entered from two threads at once, and ncclCommGetAsyncError
// completes a non-blocking group's jobs without a lock (NCCL 2.28, init.cc), so each engine
// makes every call on its communicators under its own mutex, a group from start to end under
// one hold. Engines do not share a lock: one job's ncclCommAbort (which may take seconds) must
// not hold up another job's collectives, as PyTorch's ProcessGroupNCCL aborts one group's
// communicator from its watchdog thread while other groups' threads issue theirs. Parked
// communicators (park.h) are idle and belong to the park alone.
#pragma once

#include <array>
#include <cstddef>
#include <memory>

#include "daemon/reduce/kernel.h"
#include "shared/dtype.h"
#include "shared/status.h"

namespace gradsync::nccl {

using UniqueId = std::array<char, 128>;  // ncclUniqueId

enum class CommState { kReady, kInProgress, kFailed };

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // Loads NCCL, once; every node calls it before anything else, so a node without a usable
  // NCCL fails cleanly rather than in its first call. The other calls need it to have succeeded.
  virtual Status load() = 0;

  virtual Status unique_id(UniqueId* id) = 0;
  // ncclCommInitRankConfig, non-blocking, with `device` current for the call. Made with
  // splitShare = 1: NCCL takes a split's sharing (and blocking mode) from the parent's config.
  virtual Status init_rank(int device, int ranks, const UniqueId& id, int rank, void** comm) = 0;
  // ncclCommSplit of `parent` (on `device`), sharing its resources. Collective over every rank
  // of the parent: a rank that takes no part passes kNoColor. Non-blocking: NCCL fills *comm only
  // when the parent leaves "in progress" (poll state(parent)), so *comm must stay valid until
  // then; it stays null for kNoColor. The parent must not be in progress when this is called.
  static constexpr int kNoColor = -1;  // NCCL_SPLIT_NOCOLOR
  virtual Status split(void* parent, int device, int color, int key, void** comm) = 0;
  // ncclCommGetAsyncError: ready, still in progress, or failed with *error naming why.
  virtual CommState state(void* comm, Status* error) = 0;
  // ncclCommAbort: frees the communicator; its kernels in flight return. The engine ends every
  // communicator this way, healthy or not: it is bounded, where ncclCommFinalize may wait for
  // peers that are gone.
  virtual void abort(void* comm) = 0;

  virtual Status group_start() = 0;
  virtual Status group_end() = 0;

  // In-place allowed where NCCL allows it (send == recv). Ranks are the communicator's.
  virtual Status all_reduce(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op, void* comm,
                            void* stream) = 0;
  virtual Status broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* comm,
                           void* stream) = 0;
  virtual Status reduce(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op, int root,
                        void* comm, void* stream) = 0;
  virtual Status all_gather(const void* send, void* recv, size_t count, DType dtype, void* comm, void* stream) = 0;
  virtual Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op,
                                void* comm, void* stream) = 0;

  // ncclCommRegister / ncclCommDeregister.
  virtual Status register_buffer(void* comm, void* data, size_t bytes, void** handle) = 0;
  virtual Status deregister_buffer(void* comm, void* handle) = 0;
};

// NCCL itself; only in builds with the CUDA backend (the engine factory makes it).
std::unique_ptr<NcclApi> make_nccl_api();

}  // namespace gradsync::nccl
