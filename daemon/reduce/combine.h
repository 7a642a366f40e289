// How two values combine: the one definition the kernel (kernel.cc) and the staged, cross-node
// path (staged.cc) share, so a node boundary never changes the arithmetic.
//   sum: integer sums wrap modulo 2^bits (done in the unsigned type, so defined behaviour);
//   min/max: a NaN in either value gives NaN (as torch.minimum); on ties, -0 against +0
//   included, the earlier value (acc) wins, so the result is fixed by the input order.
#pragma once

#include <type_traits>

#include "daemon/reduce/kernel.h"

namespace gradsync::reduce {

template <typename T>
T wrapping_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <Combine kCombine, typename Acc>
Acc combine(Acc acc, Acc value) {
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
