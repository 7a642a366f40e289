// The real NcclApi. NCCL is loaded with dlopen on first use rather than linked, so a gradsyncd
// built with the CUDA backend still starts (and serves host jobs) on a node without NCCL, and
// the library found is whatever the node provides (LD_LIBRARY_PATH, NCCL_LIBRARY). nccl.h gives
// the types; no symbol of it is linked.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <string>

#include "daemon/engine/nccl/api.h"
#include "shared/symbol_table.h"

namespace gradsync::nccl {
namespace {

// The entry points the engine uses, resolved once.
struct Symbols {
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&::ncclCommSplit) split = nullptr;
  decltype(&::ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclCommRegister) comm_register = nullptr;
  decltype(&::ncclCommDeregister) comm_deregister = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclGetLastError) last_error = nullptr;
  decltype(&::ncclGetVersion) get_version = nullptr;
};

ncclDataType_t to_nccl(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t to_nccl(reduce::Combine op) {
  switch (op) {
    case reduce::Combine::kSum: return ncclSum;
    case reduce::Combine::kMin: return ncclMin;
    case reduce::Combine::kMax: return ncclMax;
  }
  return ncclSum;
}

class RealNccl final : public NcclApi {
 public:
  RealNccl() = default;
  ~RealNccl() override = default;  // the library stays loaded: communicators may outlive us briefly


  Status unique_id(UniqueId* id) override {
    if (Status s = load(); !s.ok()) return s;
    static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId));
    ncclUniqueId made{};
    if (Status s = check(nccl_.get_unique_id(&made), nullptr, "ncclGetUniqueId"); !s.ok()) return s;
    std::memcpy(id->data(), &made, sizeof(made));
    return Status();
  }

  Status init_rank(int device, int ranks, const UniqueId& id, int rank, void** comm) override {
    if (Status s = load(); !s.ok()) return s;
    // Left current afterwards: the caller (a job's worker) makes its launch device current
    // before every launch, and restoring "the previous device" on a thread that never chose
    // one would create GPU 0's context.
    if (cudaSetDevice(device) != cudaSuccess) {
      return Status::internal("cudaSetDevice(" + std::to_string(device) + ") before ncclCommInitRankConfig failed");
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; the engine polls state() with a bound
    // A split child shares this communicator's proxy, streams and buffers (NCCL reads the
    // parent's splitShare, not the split's); with no split it changes nothing.
    config.splitShare = 1;
    ncclUniqueId unique{};
    std::memcpy(&unique, id.data(), sizeof(unique));
    ncclComm_t made = nullptr;
    const ncclResult_t result = nccl_.init_rank_config(&made, ranks, unique, rank, &config);
    *comm = made;
    return check(result, made, "ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " +
                                   std::to_string(ranks) + " on GPU " + std::to_string(device) + ")");
  }

  Status split(void* parent, int device, int color, int key, void** comm) override {
    if (Status s = load(); !s.ok()) return s;
    static_assert(kNoColor == NCCL_SPLIT_NOCOLOR);
    if (cudaSetDevice(device) != cudaSuccess) {
      return Status::internal("cudaSetDevice(" + std::to_string(device) + ") before ncclCommSplit failed");
    }
    // The child's own config: non-blocking and shareable like its parent, for its own splits.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.splitShare = 1;
    const ncclResult_t result =
        nccl_.split(static_cast<ncclComm_t>(parent), color, key, reinterpret_cast<ncclComm_t*>(comm), &config);
    return check(result, static_cast<ncclComm_t>(parent),
                 "ncclCommSplit (color " + std::to_string(color) + ", key " + std::to_string(key) + " on GPU " +
                     std::to_string(device) + ")");
  }

  CommState state(void* comm, Status* error) override {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t result = nccl_.get_async_error(static_cast<ncclComm_t>(comm), &async);
    if (result != ncclSuccess) {
      *error = check(result, static_cast<ncclComm_t>(comm), "ncclCommGetAsyncError");
      return CommState::kFailed;
    }
    if (async == ncclInProgress) return CommState::kInProgress;
    if (async == ncclSuccess) return CommState::kReady;
    *error = check(async, static_cast<ncclComm_t>(comm), "the communicator");
    return CommState::kFailed;
  }

  void abort(void* comm) override { (void)nccl_.abort(static_cast<ncclComm_t>(comm)); }

  Status group_start() override { return check(nccl_.group_start(), nullptr, "ncclGroupStart"); }
  Status group_end() override { return check(nccl_.group_end(), nullptr, "ncclGroupEnd"); }

  Status all_reduce(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op, void* comm,
                    void* stream) override {
    return check(nccl_.all_reduce(send, recv, count, to_nccl(dtype), to_nccl(op), static_cast<ncclComm_t>(comm),
                                  static_cast<cudaStream_t>(stream)),
                 static_cast<ncclComm_t>(comm), "ncclAllReduce");
  }
  Status broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* comm,
                   void* stream) override {
    return check(nccl_.broadcast(send, recv, count, to_nccl(dtype), root, static_cast<ncclComm_t>(comm),
                                 static_cast<cudaStream_t>(stream)),
                 static_cast<ncclComm_t>(comm), "ncclBroadcast");
  }
  Status reduce(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op, int root, void* comm,
                void* stream) override {
    return check(nccl_.reduce(send, recv, count, to_nccl(dtype), to_nccl(op), root, static_cast<ncclComm_t>(comm),
                              static_cast<cudaStream_t>(stream)),
                 static_cast<ncclComm_t>(comm), "ncclReduce");
  }
  Status all_gather(const void* send, void* recv, size_t count, DType dtype, void* comm, void* stream) override {
    return check(nccl_.all_gather(send, recv, count, to_nccl(dtype), static_cast<ncclComm_t>(comm),
                                  static_cast<cudaStream_t>(stream)),
                 static_cast<ncclComm_t>(comm), "ncclAllGather");
  }
  Status reduce_scatter(const void* send, void* recv, size_t count, DType dtype, reduce::Combine op, void* comm,
                        void* stream) override {
    return check(nccl_.reduce_scatter(send, recv, count, to_nccl(dtype), to_nccl(op), static_cast<ncclComm_t>(comm),
                                      static_cast<cudaStream_t>(stream)),
                 static_cast<ncclComm_t>(comm), "ncclReduceScatter");
  }

  Status register_buffer(void* comm, void* data, size_t bytes, void** handle) override {
    return check(nccl_.comm_register(static_cast<ncclComm_t>(comm), data, bytes, handle),
                 static_cast<ncclComm_t>(comm), "ncclCommRegister");
  }
  Status deregister_buffer(void* comm, void* handle) override {
    return check(nccl_.comm_deregister(static_cast<ncclComm_t>(comm), handle), static_cast<ncclComm_t>(comm),
                 "ncclCommDeregister");
  }

 private:
  // ncclInProgress is not an error in non-blocking mode: the engine polls state() for the end.
  Status check(ncclResult_t result, ncclComm_t comm, const std::string& what) {
    if (result == ncclSuccess || result == ncclInProgress) return Status();
    std::string text = what + " failed: " + nccl_.error_string(result);
    // NCCL keeps one last-error text per process, and engines call NCCL from their own threads
    // under their own locks: the text is most likely this call's, but may be another job's.
    if (const char* last = nccl_.last_error(comm); last && *last) {
      text += " (NCCL's last error in this process, perhaps another job's: " + std::string(last) + ")";
    }
    if (result == ncclInvalidArgument || result == ncclInvalidUsage) return Status::invalid_argument(text);
    if (result == ncclRemoteError || result == ncclSystemError) return Status::peer_lost(text);
    return Status::internal(text);
  }

  // Loads NCCL once: $NCCL_LIBRARY is not read here (no getenv deep in the code); the loader's
  // search path (LD_LIBRARY_PATH, the cache) finds libnccl.so.2.
  Status load() override {
    std::call_once(loaded_, [this] {
      library_ = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
      if (!library_) {
        load_status_ = Status::not_supported(std::string("cannot load NCCL (libnccl.so.2): ") + dlerror());
        return;
      }
      SymbolTable table(library_);
      table("ncclGetUniqueId", &nccl_.get_unique_id)
           ("ncclCommInitRankConfig", &nccl_.init_rank_config)
           ("ncclCommSplit", &nccl_.split)
           ("ncclCommGetAsyncError", &nccl_.get_async_error)
           ("ncclCommAbort", &nccl_.abort)
           ("ncclGroupStart", &nccl_.group_start)
           ("ncclGroupEnd", &nccl_.group_end)
           ("ncclAllReduce", &nccl_.all_reduce)
           ("ncclBroadcast", &nccl_.broadcast)
           ("ncclReduce", &nccl_.reduce)
           ("ncclAllGather", &nccl_.all_gather)
           ("ncclReduceScatter", &nccl_.reduce_scatter)
           ("ncclCommRegister", &nccl_.comm_register)
           ("ncclCommDeregister", &nccl_.comm_deregister)
           ("ncclGetErrorString", &nccl_.error_string)
           ("ncclGetLastError", &nccl_.last_error)
           ("ncclGetVersion", &nccl_.get_version);
      if (!table.complete()) {
        load_status_ = Status::not_supported("the NCCL found (libnccl.so.2) lacks " + table.missing() +
                                             ", which gradsync needs: NCCL 2.19 or newer is required");
        return;
      }
      int version = 0;
      if (nccl_.get_version(&version) == ncclSuccess && version < 21900) {
        load_status_ = Status::not_supported("NCCL " + std::to_string(version) + " is too old; 2.19 or newer is needed");
      }
    });
    return load_status_;
  }

  std::once_flag loaded_;
  void* library_ = nullptr;
  Status load_status_;
  Symbols nccl_;
};

}  // namespace

std::unique_ptr<NcclApi> make_nccl_api() { return std::make_unique<RealNccl>(); }

}  // namespace gradsync::nccl
