// How values are loaded, combined and stored: the one definition the kernel (kernel.cc) and the
// staged, cross-node path (staged.cc) share, so a node boundary never changes the arithmetic.
//   sum: integer sums wrap modulo 2^bits (done in the unsigned type, so defined behaviour);
//   min/max: a NaN in either value gives NaN (as torch.minimum); on ties, -0 against +0
//   included, the earlier value (acc) wins, so the result is fixed by the input order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "daemon/reduce/kernel.h"
#include "shared/half.h"
#include "shared/hd.h"

namespace gradsync::reduce {

// How a dtype is stored and in which type it is accumulated. load/store convert between them;
// store rounds to nearest even where the accumulation type is wider.
template <typename T>
struct SameCodec {
  using Storage = T;
  using Acc = T;
  GRADSYNC_HD static Acc load(Storage value) { return value; }
  GRADSYNC_HD static Storage store(Acc value) { return value; }
};

struct Float16Codec {
  using Storage = uint16_t;
  using Acc = float;
  GRADSYNC_HD static Acc load(Storage value) { return half_to_float(value); }
  GRADSYNC_HD static Storage store(Acc value) { return float_to_half(value); }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  using Acc = float;
  GRADSYNC_HD static Acc load(Storage value) { return bfloat16_to_float(value); }
  GRADSYNC_HD static Storage store(Acc value) { return float_to_bfloat16(value); }
};

template <typename T>
GRADSYNC_HD T wrapping_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <Combine kCombine, typename Acc>
GRADSYNC_HD Acc combine(Acc acc, Acc value) {
  if constexpr (kCombine == Combine::kSum) {
    if constexpr (std::is_integral_v<Acc>) {
      return wrapping_add(acc, value);
    } else {
      return acc + value;
    }
  } else if constexpr (kCombine == Combine::kMin) {
    return (value < acc || value != value) ? value : acc;
  } else {
    return (value > acc || value != value) ? value : acc;
  }
}

}  // namespace gradsync::reduce
