// Single-producer single-consumer ring of fixed-size entries in shared memory: the per-step
// path between a client and the daemon. Each side keeps its own index privately and only
// publishes it, so a broken or hostile peer that scribbles over the shared indices can make
// the ring look full or corrupt, but can never make this side read or write out of bounds.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shared/wake_word.h"

namespace gradsync {

template <class Entry, uint32_t kCapacity>
struct SpscRing {
  static_assert(kCapacity > 0 && (kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");
  static_assert(std::is_trivially_copyable_v<Entry>, "entries are copied between processes");
  using EntryType = Entry;
  static constexpr uint32_t capacity = kCapacity;

  alignas(64) std::atomic<uint64_t> head{0};  // entries consumed; written by the consumer
  alignas(64) std::atomic<uint64_t> tail{0};  // entries published; written by the producer
  alignas(64) WakeWord space;                 // consumer notifies after freeing slots
  alignas(64) Entry entries[kCapacity];
};

enum class PopResult { kOk, kEmpty, kCorrupt };

// The producer's view. Publishing does not wake anybody: the caller notifies the consumer's
// WakeWord (which may be shared by several rings) after a batch of pushes.
template <class Ring>
class RingWriter {
 public:
  explicit RingWriter(Ring* ring) : ring_(ring), tail_(ring->tail.load()) {}

  // False when the ring is full (or the consumer's index is corrupt, which looks the same).
  bool try_push(const typename Ring::EntryType& entry) {
    const uint64_t head = ring_->head.load(std::memory_order_acquire);
    if (tail_ - head >= Ring::capacity) return false;
    std::memcpy(&ring_->entries[tail_ & (Ring::capacity - 1)], &entry, sizeof(entry));
    ring_->tail.store(++tail_, std::memory_order_release);
    return true;
  }

  bool full() const { return tail_ - ring_->head.load(std::memory_order_acquire) >= Ring::capacity; }
  WakeWord& space() { return ring_->space; }

 private:
  Ring* ring_;
  uint64_t tail_;
};

// The consumer's view.
template <class Ring>
class RingReader {
 public:
  explicit RingReader(Ring* ring) : ring_(ring), head_(ring->head.load()) {}

  // Copies the next entry out of shared memory before the caller validates it, so the producer
  // cannot change it between check and use. kCorrupt when the producer's index is impossible.
  PopResult try_pop(typename Ring::EntryType* out) {
    const uint64_t tail = ring_->tail.load(std::memory_order_acquire);
    if (tail == head_) return PopResult::kEmpty;
    if (tail - head_ > Ring::capacity) return PopResult::kCorrupt;
    std::memcpy(out, &ring_->entries[head_ & (Ring::capacity - 1)], sizeof(*out));
    ring_->head.store(++head_, std::memory_order_release);
    ring_->space.notify();
    return PopResult::kOk;
  }

  bool empty() const { return ring_->tail.load(std::memory_order_acquire) == head_; }

 private:
  Ring* ring_;
  uint64_t head_;
};

}  // namespace gradsync
