#include "daemon/backend/cuda/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <set>
#include <string>

namespace gradsync::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Enough blocks to fill an H200 (132 SMs) several times over; more items than that are taken
// in the grid-stride loop.
constexpr uint64_t kMaxBlocks = 2048;

// Thin: the functor does the work, so the host tests check exactly what runs here.
template <typename Functor>
__global__ void __launch_bounds__(kThreadsPerBlock) run_items(Functor functor, BucketTable table) {
  for (uint64_t item = blockIdx.x; item < table.item_count; item += gridDim.x) {
    functor(table, item, threadIdx.x, blockDim.x);
  }
}

template <typename Functor>
Status launch(const char* what, const Functor& functor, const BucketTable& table, void* stream) {
  if (table.item_count == 0) return Status();
  const unsigned blocks = static_cast<unsigned>(std::min(table.item_count, kMaxBlocks));
  // The launch's own result, not the thread's last error (which another call may have left,
  // such as an event query's "not ready").
  Functor f = functor;
  BucketTable t = table;
  void* args[] = {&f, &t};
  const cudaError_t error = cudaLaunchKernel(reinterpret_cast<const void*>(&run_items<Functor>), dim3(blocks),
                                             dim3(kThreadsPerBlock), args, 0, static_cast<cudaStream_t>(stream));
  if (error != cudaSuccess) {
    return Status::internal(std::string("launching the ") + what + " kernel failed: " + cudaGetErrorString(error));
  }
  return Status();
}

// One warp per health block (health_functor.h): the lanes' sums added in lane order by lane 0.
constexpr unsigned kHealthThreads = 32;
static_assert(kHealthThreads == reduce::kHealthLanes, "a warp's lanes are the health lanes");

template <typename Codec>
__global__ void __launch_bounds__(kHealthThreads) run_health(HealthTable table) {
  for (uint64_t item = blockIdx.x; item < table.item_count; item += gridDim.x) {
    double sum = 0;
    bool bad = false;
    HealthLane<Codec>::run(table.items[item], threadIdx.x, &sum, &bad);
    const bool any_bad = __any_sync(0xffffffffu, bad);
    double total = 0;
    for (int lane = 0; lane < static_cast<int>(kHealthThreads); ++lane) {
      total = health_add(total, __shfl_sync(0xffffffffu, sum, lane));
    }
    if (threadIdx.x == 0) table.out[table.items[item].out] = reduce::HealthBlock{total, any_bad ? 1u : 0u};
  }
}

// Enough blocks of one warp to keep every SM's resident-block slots busy.
constexpr uint64_t kMaxHealthBlocks = 8192;

template <typename Codec, reduce::Scale kScale>
typename Codec::Acc divisor_of(const reduce::KernelArgs& args) {
  using Acc = typename Codec::Acc;
  return kScale == reduce::Scale::kNone ? Acc{1} : static_cast<Acc>(args.divisor);
}

template <typename Functor>
Status load(std::set<const void*>* loaded) {
  const void* kernel = reinterpret_cast<const void*>(&run_items<Functor>);
  if (!loaded->insert(kernel).second) return Status();  // selected by another combination too
  cudaFuncAttributes attributes{};
  if (const cudaError_t error = cudaFuncGetAttributes(&attributes, kernel); error != cudaSuccess) {
    return Status::internal(std::string("loading a kernel failed: ") + cudaGetErrorString(error));
  }
  return Status();
}

}  // namespace

Status preload_kernels(int* count) {
  std::set<const void*> loaded;
  // Every combination dispatch() can select, through dispatch() itself, so the kernels loaded
  // are exactly the ones launch_gather and launch_scatter launch.
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                      DType::kInt64, DType::kUInt8}) {
    for (reduce::Combine combine : {reduce::Combine::kSum, reduce::Combine::kMin, reduce::Combine::kMax}) {
      for (reduce::Scale scale : {reduce::Scale::kNone, reduce::Scale::kBefore, reduce::Scale::kAfter}) {
        for (bool wide : {true, false}) {
          const reduce::KernelArgs args{.dtype = dtype, .combine = combine, .scale = scale, .wide_accumulate = wide};
          const Status status =
              dispatch(args, [&]<typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRound>() {
                constexpr reduce::Scale kAfter = kCombine == reduce::Combine::kSum ? kScale : reduce::Scale::kNone;
                Status s = load<GatherItem<Codec, kCombine, kScale, kRound>>(&loaded);
                if (s.ok()) s = load<ScatterItem<Codec, kAfter, kRound>>(&loaded);
                return s;
              });
          if (!status.ok()) return status;
        }
      }
    }
  }
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const Status status = dispatch_health(dtype, [&]<typename Codec>() {
      const void* kernel = reinterpret_cast<const void*>(&run_health<Codec>);
      if (!loaded.insert(kernel).second) return Status();
      cudaFuncAttributes attributes{};
      if (const cudaError_t error = cudaFuncGetAttributes(&attributes, kernel); error != cudaSuccess) {
        return Status::internal(std::string("loading a kernel failed: ") + cudaGetErrorString(error));
      }
      return Status();
    });
    if (!status.ok()) return status;
  }
  *count = static_cast<int>(loaded.size());
  return Status();
}

Status launch_gather(const reduce::KernelArgs& args, const BucketTable& table, void* stream) {
  return dispatch(args, [&]<typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRound>() {
    return launch("gather", GatherItem<Codec, kCombine, kScale, kRound>{divisor_of<Codec, kScale>(args)}, table,
                  stream);
  });
}

Status launch_scatter(const reduce::KernelArgs& args, const BucketTable& table, void* stream) {
  return dispatch(args, [&]<typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRound>() {
    // Only a sum is scaled after combining; min and max results are stored as they are.
    constexpr reduce::Scale kAfter = kCombine == reduce::Combine::kSum ? kScale : reduce::Scale::kNone;
    return launch("scatter", ScatterItem<Codec, kAfter, kRound>{divisor_of<Codec, kAfter>(args)}, table, stream);
  });
}

Status launch_health(DType dtype, const HealthTable& table, void* stream) {
  return dispatch_health(dtype, [&]<typename Codec>() {
    if (table.item_count == 0) return Status();
    const unsigned blocks = static_cast<unsigned>(std::min(table.item_count, kMaxHealthBlocks));
    HealthTable t = table;
    void* args[] = {&t};
    const cudaError_t error = cudaLaunchKernel(reinterpret_cast<const void*>(&run_health<Codec>), dim3(blocks),
                                               dim3(kHealthThreads), args, 0, static_cast<cudaStream_t>(stream));
    if (error != cudaSuccess) {
      return Status::internal(std::string("launching the health kernel failed: ") + cudaGetErrorString(error));
    }
    return Status();
  });
}

}  // namespace gradsync::cuda
