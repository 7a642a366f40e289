#include "daemon/plan/layout.h"

#include <algorithm>
#include <cstddef>

namespace gradsync::plan {
namespace {

bool same_tensor(const TensorLayout& a, const TensorLayout& b) {
  return a.dtype == b.dtype && a.numel == b.numel && a.group == b.group;
}

// FNV-1a 64. Fed a canonical little-endian encoding, so the digest depends only on the
// layout's values, never on the host's byte order, word size or standard library.
class Fnv1a64 {
 public:
  void add_bytes(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      state_ ^= bytes[i];
      state_ *= kPrime;
    }
  }

  void add_u32(uint32_t value) {
    for (int shift = 0; shift < 32; shift += 8) {
      add_byte(static_cast<unsigned char>(value >> shift));
    }
  }

  void add_u64(uint64_t value) {
    for (int shift = 0; shift < 64; shift += 8) {
      add_byte(static_cast<unsigned char>(value >> shift));
    }
  }

  uint64_t digest() const { return state_; }

 private:
  static constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  static constexpr uint64_t kPrime = 0x100000001b3ull;

  void add_byte(unsigned char byte) { add_bytes(&byte, 1); }

  uint64_t state_ = kOffsetBasis;
};

}  // namespace

std::optional<std::string> first_difference(std::span<const TensorLayout> a, int rank_a,
                                            std::span<const TensorLayout> b, int rank_b) {
  // A differing tensor inside the common prefix is reported before a count difference: it is
  // the more specific clue (a rank that skipped one parameter differs at that index).
  const size_t common = std::min(a.size(), b.size());
  for (size_t i = 0; i < common; ++i) {
    if (same_tensor(a[i], b[i])) continue;
    return "tensor " + std::to_string(i) + " differs: rank " + std::to_string(rank_a) + " has " +
           describe(a[i]) + ", rank " + std::to_string(rank_b) + " has " + describe(b[i]);
  }
  if (a.size() != b.size()) {
    return "rank " + std::to_string(rank_a) + " registered " + std::to_string(a.size()) +
           " tensors, rank " + std::to_string(rank_b) + " registered " + std::to_string(b.size());
  }
  return std::nullopt;
}

// Encoding: count (u64); then per tensor dtype (u32, the wire value), numel (u64), group
// length (u64), group bytes. The length prefix keeps ("ab","c") apart from ("a","bc").
// Changing this encoding changes every fingerprint, so mixed daemon versions would disagree.
uint64_t fingerprint(std::span<const TensorLayout> layout) {
  Fnv1a64 hash;
  hash.add_u64(layout.size());
  for (const TensorLayout& tensor : layout) {
    hash.add_u32(static_cast<uint32_t>(tensor.dtype));
    hash.add_u64(tensor.numel);
    hash.add_u64(tensor.group.size());
    hash.add_bytes(tensor.group.data(), tensor.group.size());
  }
  return hash.digest();
}

std::string describe(const TensorLayout& tensor) {
  std::string text(dtype_name(tensor.dtype));
  text += '[';
  text += std::to_string(tensor.numel);
  text += "] in group '";
  text += tensor.group;
  text += '\'';
  return text;
}

}  // namespace gradsync::plan
