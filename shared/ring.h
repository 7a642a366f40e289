// Single-producer single-consumer ring of fixed-size entries in shared memory: the per-step
// path between a client and the daemon. Each side keeps its own index privately and only
// publishes it, so a broken or hostile peer that scribbles over the shared indices can make
// the ring look full or corrupt, but can never make this side read or write out of bounds.
//
// A ring has two halves, each written by one side only: RingData (the producer's tail and the
// entries) and RingCursor (the consumer's head and its space wake-up). They may live in
// different memory, so that the consumer can be given the data half read-only: a client can
// then never write its own completion entries, let alone another client's.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "shared/wake_word.h"

namespace gradsync {

// Written by the producer only.
template <class Entry, uint32_t kCapacity>
struct RingData {
  static_assert(kCapacity > 0 && (kCapacity & (kCapacity - 1)) == 0, "capacity must be a power of two");
  static_assert(std::is_trivially_copyable_v<Entry>, "entries are copied between processes");
  using EntryType = Entry;
  static constexpr uint32_t capacity = kCapacity;

  alignas(64) std::atomic<uint64_t> tail{0};  // entries published
  alignas(64) Entry entries[kCapacity];
};

// Written by the consumer only.
struct RingCursor {
  alignas(64) std::atomic<uint64_t> head{0};  // entries consumed
  alignas(64) WakeWord space;                 // the consumer notifies after freeing slots
};

// Both halves in one place, for a ring whose two sides may both write the memory (the
// submission ring, which lives in memory the client writes anyway).
template <class Entry, uint32_t kCapacity>
struct SpscRing {
  using Data = RingData<Entry, kCapacity>;
  using EntryType = Entry;
  static constexpr uint32_t capacity = kCapacity;

  RingCursor cursor;
  Data data;
};

enum class PopResult { kOk, kEmpty, kCorrupt };

// The two sides read each other's index only when their own last copy of it runs out: the
// producer re-reads the head when the ring looks full, the consumer re-reads the tail when it
// has consumed everything it last saw. On the per-tensor path (one mark_ready per tensor) this
// keeps the other side's cache line from moving between cores for every entry.

// The producer's view. Publishing does not wake anybody: the caller notifies the consumer's
// WakeWord (which may be shared by several rings) after a batch of pushes.
template <class Ring>
class RingWriter {
 public:
  using Data = typename Ring::Data;
  explicit RingWriter(Ring* ring) : RingWriter(&ring->data, &ring->cursor) {}
  RingWriter(Data* data, RingCursor* cursor)
      : data_(data), cursor_(cursor), tail_(data->tail.load()), head_seen_(cursor->head.load()) {}

  // False when the ring is full (or the consumer's index is corrupt, which looks the same).
  bool try_push(const typename Ring::EntryType& entry) {
    if (full()) return false;
    std::memcpy(&data_->entries[tail_ & (Ring::capacity - 1)], &entry, sizeof(entry));
    data_->tail.store(++tail_, std::memory_order_release);
    return true;
  }

  bool full() {
    if (tail_ - head_seen_ < Ring::capacity) return false;
    head_seen_ = cursor_->head.load(std::memory_order_acquire);
    return tail_ - head_seen_ >= Ring::capacity;
  }
  WakeWord& space() { return cursor_->space; }

 private:
  Data* data_;
  RingCursor* cursor_;
  uint64_t tail_;
  uint64_t head_seen_;  // the consumer's head when last read; the true one is never behind it
};

// The consumer's view; it reads the data half and writes only the cursor.
//
// It publishes its head (and wakes a producer waiting for space) at once when it pops from a
// ring it found full, when it has consumed every entry it saw, and otherwise every
// kPublishEvery entries: a producer waiting for space is told of it at most kPublishEvery pops
// after it was freed. (It may fill the ring after the consumer last read the tail, so the
// first free slot is not always published at once.) Every consumer drains until kEmpty, or
// comes back to it, so nothing it consumed stays unpublished while it sleeps.
template <class Ring>
class RingReader {
 public:
  using Data = typename Ring::Data;
  static constexpr uint64_t kPublishEvery = 64;

  explicit RingReader(Ring* ring) : RingReader(&ring->data, &ring->cursor) {}
  RingReader(const Data* data, RingCursor* cursor)
      : data_(data), cursor_(cursor), head_(cursor->head.load()), published_(head_), tail_seen_(head_) {}

  // Copies the next entry out of shared memory before the caller validates it, so the producer
  // cannot change it between check and use. kCorrupt when the producer's index is impossible.
  PopResult try_pop(typename Ring::EntryType* out) {
    if (tail_seen_ == head_) {
      const uint64_t tail = data_->tail.load(std::memory_order_acquire);
      if (tail == head_) return PopResult::kEmpty;
      if (tail - head_ > Ring::capacity) return PopResult::kCorrupt;
      tail_seen_ = tail;
    }
    const bool was_full = tail_seen_ - head_ == Ring::capacity;
    std::memcpy(out, &data_->entries[head_ & (Ring::capacity - 1)], sizeof(*out));
    ++head_;
    if (was_full || head_ == tail_seen_ || head_ - published_ >= kPublishEvery) {
      cursor_->head.store(head_, std::memory_order_release);
      published_ = head_;
      cursor_->space.notify();
    }
    return PopResult::kOk;
  }

  bool empty() const { return tail_seen_ == head_ && data_->tail.load(std::memory_order_acquire) == head_; }

 private:
  const Data* data_;
  RingCursor* cursor_;
  uint64_t head_;
  uint64_t published_;  // the head as the producer can see it
  uint64_t tail_seen_;  // the producer's tail when last read (validated)
};

}  // namespace gradsync
