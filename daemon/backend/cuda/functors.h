// The arithmetic of the CUDA backend's per-bucket kernels, as functors that run on the host too
// (GRADSYNC_HD), so host unit tests check the code the GPU runs against the host kernels
// (reduce/kernel.h, reduce/staged.h), bit for bit.
//
// A bucket on one GPU is a list of segments: one per tensor, with the tensor's address in every
// same-GPU client (in local rank order) and its place in the bucket buffer. The launch is
// batched: the segments are cut into work items of at most kItemElements elements, once, when
// the set is registered, and one launch covers every item of the bucket (any number of
// tensors). Each block takes items in a grid-stride loop; the threads of a block stride over
// the item's elements.
//
//   GatherItem:  acc[offset + i] = combine over clients, in rank order, of load(src[c][i]),
//                prescaled (avg, divide before) and, on the narrow half path, rounded after
//                every step; acc holds the accumulation type (float32 for the half types).
//                This is reduce/staged.h's accumulate(), element for element.
//   ScatterItem: dst[c][i] = store(acc[offset + i]), post-divided first for avg, divide after:
//                staged.h's finish().
// Gather then scatter on one GPU equals reduce/kernel.h's reduce() bit for bit, which is what
// makes clients sharing a GPU agree with the host path.
//
// Vector access: an item whose addresses are all 16-byte aligned moves its storage-type
// elements, and the accumulator's stretch for them, 16 bytes per load or store; any other item
// goes element by element. Results do not depend on which path ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "daemon/reduce/combine.h"
#include "daemon/reduce/kernel.h"
#include "shared/hd.h"

namespace gradsync::cuda {

// Elements per work item: big enough to amortize a block's start, small enough that a bucket
// of a few MiB still spreads over every SM.
inline constexpr uint64_t kItemElements = 8192;

// The most clients of one job that may share one GPU (the pointer table's width).
inline constexpr uint32_t kMaxClientsPerDevice = 16;

struct WorkItem {
  uint32_t segment = 0;
  uint64_t first = 0;  // element offset within the segment
  uint64_t count = 0;
};

// One tensor of a bucket on one GPU.
struct Segment {
  uint64_t bucket_offset = 0;  // elements into the bucket buffer (accumulation type)
  uint64_t count = 0;
  // Its address in each same-GPU client that takes part, rank order; `clients` of them.
  void* address[kMaxClientsPerDevice] = {};
};

// What one launch needs, all in memory the kernel can read (device memory on the GPU, host
// memory in tests).
struct BucketTable {
  const Segment* segments = nullptr;
  const WorkItem* items = nullptr;
  uint64_t item_count = 0;
  uint32_t clients = 0;  // gather: inputs combined; scatter: outputs written
  void* acc = nullptr;   // the bucket buffer, accumulation type
};

template <typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRoundEach>
struct Arithmetic {
  using Storage = typename Codec::Storage;
  using Acc = typename Codec::Acc;

  GRADSYNC_HD static Acc round(Acc v) {
    if constexpr (kRoundEach) {
      return Codec::load(Codec::store(v));
    } else {
      return v;
    }
  }
  GRADSYNC_HD static Acc prescale(Acc v, Acc divisor) {
    if constexpr (kScale == reduce::Scale::kBefore) {
      return round(v / divisor);
    } else {
      return v;
    }
  }
  GRADSYNC_HD static Acc postscale(Acc v, Acc divisor) {
    if constexpr (kScale == reduce::Scale::kAfter) {
      return round(v / divisor);
    } else {
      return v;
    }
  }
};

namespace detail {

inline constexpr size_t kVectorBytes = 16;

GRADSYNC_HD inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

// `kBytes` (a multiple of 16) between memory and registers, 16 bytes per access: on the device
// one ld.global.cg.v4.u32 / st.global.cg.v4.u32 each (a plain 16-byte struct copy compiles to
// narrower accesses, seen in the sm_90 PTX; tests/gpu/check_ptx.py checks the kernels). The
// .cg forms cache in L2 only: every byte is touched once per launch, and a zero-copy scaling
// pass reads and writes the same memory, which rules out the non-coherent read-only path.
template <size_t kBytes>
GRADSYNC_HD inline void load_bytes(const void* from, void* to) {
  static_assert(kBytes % kVectorBytes == 0);
#if defined(__CUDA_ARCH__)
  for (size_t i = 0; i < kBytes / kVectorBytes; ++i) {
    const uint4 v = __ldcg(static_cast<const uint4*>(from) + i);
    memcpy(static_cast<unsigned char*>(to) + i * kVectorBytes, &v, kVectorBytes);
  }
#else
  memcpy(to, from, kBytes);
#endif
}

template <size_t kBytes>
GRADSYNC_HD inline void store_bytes(void* to, const void* from) {
  static_assert(kBytes % kVectorBytes == 0);
#if defined(__CUDA_ARCH__)
  for (size_t i = 0; i < kBytes / kVectorBytes; ++i) {
    uint4 v;
    memcpy(&v, static_cast<const unsigned char*>(from) + i * kVectorBytes, kVectorBytes);
    __stcg(static_cast<uint4*>(to) + i, v);
  }
#else
  memcpy(to, from, kBytes);
#endif
}

// One 16-byte vector of storage-type elements.
template <typename T>
GRADSYNC_HD inline void load_vector(const T* from, T (&to)[kVectorBytes / sizeof(T)]) {
  load_bytes<kVectorBytes>(from, to);
}

template <typename T>
GRADSYNC_HD inline void store_vector(T* to, const T (&from)[kVectorBytes / sizeof(T)]) {
  store_bytes<kVectorBytes>(to, from);
}

// The accumulator's stretch for one storage vector: kWidth elements of the accumulation type
// (16 bytes for float32, float64 and the integers; 32 for the half types, which accumulate in
// float32), moved as whole 16-byte vectors.
template <typename Acc, uint32_t kWidth>
GRADSYNC_HD inline void load_acc(const Acc* from, Acc (&to)[kWidth]) {
  load_bytes<sizeof(Acc) * kWidth>(from, to);
}

template <typename Acc, uint32_t kWidth>
GRADSYNC_HD inline void store_acc(Acc* to, const Acc (&from)[kWidth]) {
  store_bytes<sizeof(Acc) * kWidth>(to, from);
}

// Whether an item moves 16 bytes at a time: the bucket buffer's stretch and every client's
// tensor piece must be 16-byte aligned (work items start at multiples of kItemElements, so a
// tensor that starts aligned has every item aligned).
template <typename Storage, typename Acc, uint32_t kWidth>
GRADSYNC_HD inline bool vector_path(const Acc* acc, const Segment& s, const WorkItem& w, uint32_t clients) {
  bool ok = aligned(acc) && sizeof(Acc) * kWidth % kVectorBytes == 0;
  for (uint32_t c = 0; c < clients; ++c) ok = ok && aligned(static_cast<const Storage*>(s.address[c]) + w.first);
  return ok;
}

}  // namespace detail

// Runs the elements [lane, lane + lanes, ...) of work item `item`: a block's thread `lane` of
// `lanes`, or lane 0 of 1 on the host.
template <typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRoundEach>
struct GatherItem {
  using A = Arithmetic<Codec, kCombine, kScale, kRoundEach>;
  using Storage = typename A::Storage;
  using Acc = typename A::Acc;
  static constexpr uint32_t kWidth = detail::kVectorBytes / sizeof(Storage);

  GRADSYNC_HD void operator()(const BucketTable& t, uint64_t item, uint32_t lane, uint32_t lanes) const {
    const WorkItem w = t.items[item];
    const Segment& s = t.segments[w.segment];
    Acc* acc = static_cast<Acc*>(t.acc) + s.bucket_offset + w.first;
    uint64_t i = 0;
    if (detail::vector_path<Storage, Acc, kWidth>(acc, s, w, t.clients)) {
      const uint64_t vectors = w.count / kWidth;
      for (uint64_t v = lane; v < vectors; v += lanes) gather_vector(t, s, w, acc, v * kWidth);
      i = vectors * kWidth;
    }
    for (uint64_t k = i + lane; k < w.count; k += lanes) gather_one(t, s, w, acc, k);
  }

  Acc divisor;

 private:
  GRADSYNC_HD static const Storage* source(const Segment& s, uint32_t c, const WorkItem& w) {
    return static_cast<const Storage*>(s.address[c]) + w.first;
  }

  GRADSYNC_HD void gather_one(const BucketTable& t, const Segment& s, const WorkItem& w, Acc* acc, uint64_t k) const {
    Acc result = A::prescale(Codec::load(source(s, 0, w)[k]), divisor);
    for (uint32_t c = 1; c < t.clients; ++c) {
      result = A::round(reduce::combine<kCombine>(result, A::prescale(Codec::load(source(s, c, w)[k]), divisor)));
    }
    acc[k] = result;
  }

  GRADSYNC_HD void gather_vector(const BucketTable& t, const Segment& s, const WorkItem& w, Acc* acc,
                                 uint64_t k) const {
    Storage in[kWidth];
    Acc result[kWidth];
    detail::load_vector(source(s, 0, w) + k, in);
    for (uint32_t e = 0; e < kWidth; ++e) result[e] = A::prescale(Codec::load(in[e]), divisor);
    for (uint32_t c = 1; c < t.clients; ++c) {
      detail::load_vector(source(s, c, w) + k, in);
      for (uint32_t e = 0; e < kWidth; ++e) {
        result[e] = A::round(reduce::combine<kCombine>(result[e], A::prescale(Codec::load(in[e]), divisor)));
      }
    }
    detail::store_acc<Acc, kWidth>(acc + k, result);
  }
};

template <typename Codec, reduce::Scale kScale, bool kRoundEach>
struct ScatterItem {
  using A = Arithmetic<Codec, reduce::Combine::kSum, kScale, kRoundEach>;
  using Storage = typename A::Storage;
  using Acc = typename A::Acc;
  static constexpr uint32_t kWidth = detail::kVectorBytes / sizeof(Storage);

  GRADSYNC_HD void operator()(const BucketTable& t, uint64_t item, uint32_t lane, uint32_t lanes) const {
    const WorkItem w = t.items[item];
    const Segment& s = t.segments[w.segment];
    const Acc* acc = static_cast<const Acc*>(t.acc) + s.bucket_offset + w.first;
    uint64_t i = 0;
    if (detail::vector_path<Storage, Acc, kWidth>(acc, s, w, t.clients)) {
      const uint64_t vectors = w.count / kWidth;
      for (uint64_t v = lane; v < vectors; v += lanes) {
        Acc in[kWidth];
        detail::load_acc<Acc, kWidth>(acc + v * kWidth, in);
        Storage out[kWidth];
        for (uint32_t e = 0; e < kWidth; ++e) out[e] = Codec::store(A::postscale(in[e], divisor));
        for (uint32_t c = 0; c < t.clients; ++c) detail::store_vector(target(s, c, w) + v * kWidth, out);
      }
      i = vectors * kWidth;
    }
    for (uint64_t k = i + lane; k < w.count; k += lanes) {
      const Storage out = Codec::store(A::postscale(acc[k], divisor));
      for (uint32_t c = 0; c < t.clients; ++c) target(s, c, w)[k] = out;
    }
  }

  Acc divisor;

 private:
  GRADSYNC_HD static Storage* target(const Segment& s, uint32_t c, const WorkItem& w) {
    return static_cast<Storage*>(s.address[c]) + w.first;
  }
};

// Calls body.template operator()<Codec, Combine, Scale, RoundEach>() for the combination that
// `args` selects, and returns what it returns, so every caller (the kernels' launchers, the
// host tests) dispatches the same way. `args` must have passed validate_kernel_args (integers
// never scale).
template <typename Body>
decltype(auto) dispatch(const reduce::KernelArgs& args, Body&& body) {
  using reduce::Combine;
  using reduce::Scale;
  auto by_scale = [&](auto codec, auto combine, auto round) {
    using Codec = decltype(codec);
    constexpr Combine kCombine = decltype(combine)::value;
    constexpr bool kRound = decltype(round)::value;
    // validate_kernel_args allows scaling only for sums of floating types: the other
    // combinations are never instantiated (no integer divides in device code, fewer kernels).
    if constexpr (std::is_integral_v<typename Codec::Acc> || kCombine != Combine::kSum) {
      return body.template operator()<Codec, kCombine, Scale::kNone, kRound>();
    } else {
      switch (args.scale) {
        case Scale::kNone: return body.template operator()<Codec, kCombine, Scale::kNone, kRound>();
        case Scale::kBefore: return body.template operator()<Codec, kCombine, Scale::kBefore, kRound>();
        default: return body.template operator()<Codec, kCombine, Scale::kAfter, kRound>();
      }
    }
  };
  auto by_combine = [&](auto codec, auto round) {
    switch (args.combine) {
      case Combine::kSum: return by_scale(codec, std::integral_constant<Combine, Combine::kSum>{}, round);
      case Combine::kMin: return by_scale(codec, std::integral_constant<Combine, Combine::kMin>{}, round);
      default: return by_scale(codec, std::integral_constant<Combine, Combine::kMax>{}, round);
    }
  };
  const bool round = !args.wide_accumulate;
  switch (args.dtype) {
    case DType::kFloat32: return by_combine(reduce::SameCodec<float>{}, std::false_type{});
    case DType::kFloat64: return by_combine(reduce::SameCodec<double>{}, std::false_type{});
    case DType::kFloat16:
      return round ? by_combine(reduce::Float16Codec{}, std::true_type{})
                   : by_combine(reduce::Float16Codec{}, std::false_type{});
    case DType::kBFloat16:
      return round ? by_combine(reduce::BFloat16Codec{}, std::true_type{})
                   : by_combine(reduce::BFloat16Codec{}, std::false_type{});
    case DType::kInt32: return by_combine(reduce::SameCodec<int32_t>{}, std::false_type{});
    case DType::kInt64: return by_combine(reduce::SameCodec<int64_t>{}, std::false_type{});
    default: return by_combine(reduce::SameCodec<uint8_t>{}, std::false_type{});  // kUInt8
  }
}

}  // namespace gradsync::cuda
