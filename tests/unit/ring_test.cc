// The shared-memory ring and its wake-up word: ordering, full/empty, resistance to a peer that
// scribbles over the shared indices, and the cross-process handshake the per-step path relies on.
#include "shared/ring.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "shared/channel_layout.h"
#include "shared/wake_word.h"

namespace gradsync {
namespace {

using std::chrono::steady_clock;
using namespace std::chrono_literals;

// A bound on every wait that should end long before it: it only keeps a broken build from
// hanging the test run, and is never the thing a test measures.
constexpr auto kHangGuard = 60s;

// A small ring, so that tests wrap around and fill it often.
struct TestEntry {
  uint64_t value = 0;
};
using TestRing = SpscRing<TestEntry, 8>;

// Entry number i of a test stream. SubmitEntry fills several fields from i so that a torn or
// misplaced copy shows up, not only a wrong sequence number.
template <class Entry>
Entry make_entry(uint64_t i) {
  Entry entry;
  if constexpr (std::is_same_v<Entry, SubmitEntry>) {
    entry.kind = static_cast<uint32_t>(SubmitKind::kOp);
    entry.op_seq = i;
    entry.set_id = static_cast<uint32_t>(i * 2654435761u);
    entry.tensor_index = ~static_cast<uint32_t>(i);
    entry.divisor = static_cast<double>(i);
  } else {
    entry.value = i;
  }
  return entry;
}

bool entry_is(const TestEntry& entry, uint64_t i) { return entry.value == i; }

bool entry_is(const SubmitEntry& entry, uint64_t i) {
  const SubmitEntry want = make_entry<SubmitEntry>(i);
  return entry.kind == want.kind && entry.op_seq == want.op_seq && entry.set_id == want.set_id &&
         entry.tensor_index == want.tensor_index && entry.divisor == want.divisor;
}

// One T in anonymous shared memory, as a channel segment would be: it survives fork() and both
// processes see each other's writes.
template <class T>
class SharedObject {
 public:
  SharedObject() {
    void* memory = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(memory != MAP_FAILED);
    object_ = new (memory) T();
  }
  ~SharedObject() {
    object_->~T();
    munmap(object_, sizeof(T));
  }
  SharedObject(const SharedObject&) = delete;
  SharedObject& operator=(const SharedObject&) = delete;

  T* get() const { return object_; }
  T* operator->() const { return object_; }

 private:
  T* object_ = nullptr;
};

TEMPLATE_TEST_CASE("ring delivers entries in FIFO order across wrap-around", "[ring]", TestRing, SubmitRing) {
  using Entry = typename TestType::EntryType;
  constexpr uint64_t kCapacity = TestType::capacity;
  auto ring = std::make_unique<TestType>();
  RingWriter<TestType> writer(ring.get());
  RingReader<TestType> reader(ring.get());

  // Uneven push and pop batches, so the indices cross the end of the array at many offsets.
  const uint64_t total = 3 * kCapacity + 5;
  uint64_t pushed = 0;
  uint64_t popped = 0;
  uint64_t out_of_order = 0;
  for (uint64_t round = 0; popped < total; ++round) {
    for (uint64_t n = round % kCapacity + 1; n > 0 && pushed < total; --n) {
      if (!writer.try_push(make_entry<Entry>(pushed))) break;
      ++pushed;
    }
    for (uint64_t n = (round * 3) % kCapacity + 1; n > 0; --n) {
      Entry entry;
      const PopResult result = reader.try_pop(&entry);
      if (result == PopResult::kEmpty) break;
      REQUIRE(result == PopResult::kOk);
      if (!entry_is(entry, popped)) ++out_of_order;
      ++popped;
    }
  }
  CHECK(out_of_order == 0);
  CHECK(pushed == total);
  CHECK(reader.empty());
  // The published indices count entries, not slots, so they ran past the capacity.
  CHECK(ring->cursor.head.load() == total);
  CHECK(ring->data.tail.load() == total);
}

TEMPLATE_TEST_CASE("full ring rejects a push and accepts one again after a pop", "[ring]", TestRing, SubmitRing) {
  using Entry = typename TestType::EntryType;
  constexpr uint64_t kCapacity = TestType::capacity;
  auto ring = std::make_unique<TestType>();
  RingWriter<TestType> writer(ring.get());
  RingReader<TestType> reader(ring.get());

  for (uint64_t i = 0; i < kCapacity; ++i) REQUIRE(writer.try_push(make_entry<Entry>(i)));
  CHECK(writer.full());
  CHECK_FALSE(writer.try_push(make_entry<Entry>(kCapacity)));
  CHECK(ring->data.tail.load() == kCapacity);  // the refused push published nothing

  Entry entry;
  REQUIRE(reader.try_pop(&entry) == PopResult::kOk);
  CHECK(entry_is(entry, 0));
  CHECK_FALSE(writer.full());
  CHECK(writer.try_push(make_entry<Entry>(kCapacity)));
  CHECK_FALSE(writer.try_push(make_entry<Entry>(kCapacity + 1)));

  // The survivors, including the one written into the freed slot, come out in order.
  for (uint64_t i = 1; i <= kCapacity; ++i) {
    REQUIRE(reader.try_pop(&entry) == PopResult::kOk);
    CHECK(entry_is(entry, i));
  }
  CHECK(reader.try_pop(&entry) == PopResult::kEmpty);
}

TEMPLATE_TEST_CASE("corrupted tail makes the reader report kCorrupt without reading", "[ring]", TestRing,
                   SubmitRing) {
  using Entry = typename TestType::EntryType;
  constexpr uint64_t kCapacity = TestType::capacity;
  auto ring = std::make_unique<TestType>();
  RingWriter<TestType> writer(ring.get());
  RingReader<TestType> reader(ring.get());

  // Move the indices off zero first, so that "behind the head" is a real position.
  constexpr uint64_t kHead = 3;
  Entry entry;
  for (uint64_t i = 0; i < kHead; ++i) REQUIRE(writer.try_push(make_entry<Entry>(i)));
  for (uint64_t i = 0; i < kHead; ++i) REQUIRE(reader.try_pop(&entry) == PopResult::kOk);

  const Entry sentinel = make_entry<Entry>(0xdeadbeef);
  const uint64_t bad_tails[] = {
      kHead + kCapacity + 1,                   // more entries than the ring can hold
      kHead - 1,                               // behind the consumer
      std::numeric_limits<uint64_t>::max(),    // garbage
      kHead + (uint64_t{1} << 63),             // far ahead, same slot as the head
  };
  for (const uint64_t bad_tail : bad_tails) {
    CAPTURE(bad_tail);
    ring->data.tail.store(bad_tail);
    Entry out = sentinel;
    CHECK(reader.try_pop(&out) == PopResult::kCorrupt);
    CHECK(entry_is(out, 0xdeadbeef));  // nothing was copied out
    CHECK(ring->cursor.head.load() == kHead);  // and nothing was consumed
  }

  // The reader kept its own index: once the tail is sane again, so is the ring.
  ring->data.tail.store(kHead);
  CHECK(reader.try_pop(&entry) == PopResult::kEmpty);
}

TEMPLATE_TEST_CASE("corrupted head makes the writer see a full ring instead of overwriting", "[ring]", TestRing,
                   SubmitRing) {
  using Entry = typename TestType::EntryType;
  constexpr uint64_t kCapacity = TestType::capacity;
  auto ring = std::make_unique<TestType>();
  RingWriter<TestType> writer(ring.get());

  // The writer reads the consumer's head only when its own count says the ring is full (it
  // writes only slots it knows were freed), so fill the ring first.
  constexpr uint64_t kTail = kCapacity;
  for (uint64_t i = 0; i < kTail; ++i) REQUIRE(writer.try_push(make_entry<Entry>(i)));
  std::vector<std::byte> before(sizeof(ring->data.entries));
  std::memcpy(before.data(), ring->data.entries, before.size());

  // Indices are free-running 64-bit counters, so "corrupt" means impossible relative to the
  // writer's own tail: ahead of it, or further behind than the ring holds. (A head a little
  // behind is a plausible backlog, not corruption.)
  const uint64_t bad_heads[] = {
      kTail + 1,                   // the consumer claims more than was published
      kTail + (uint64_t{1} << 40), // far ahead
      kTail - kCapacity - 1,       // more unconsumed entries than the ring can hold (wraps)
  };
  for (const uint64_t bad_head : bad_heads) {
    CAPTURE(bad_head);
    ring->cursor.head.store(bad_head);
    CHECK(writer.full());
    CHECK_FALSE(writer.try_push(make_entry<Entry>(0xdeadbeef)));
    CHECK(ring->data.tail.load() == kTail);
    CHECK(std::memcmp(before.data(), ring->data.entries, before.size()) == 0);
  }

  // The writer kept its own index: once the head is sane again, pushing resumes where it left off.
  ring->cursor.head.store(1);
  CHECK(writer.try_push(make_entry<Entry>(kTail)));
  CHECK(ring->data.tail.load() == kTail + 1);
}

TEST_CASE("the reader publishes its head every kPublishEvery entries, on emptying and on a full ring", "[ring]") {
  using Reader = RingReader<SubmitRing>;
  auto ring = std::make_unique<SubmitRing>();
  RingWriter<SubmitRing> writer(ring.get());
  Reader reader(ring.get());
  constexpr uint64_t kBacklog = 1000;
  static_assert(kBacklog > 2 * Reader::kPublishEvery && kBacklog < SubmitRing::capacity);
  for (uint64_t i = 0; i < kBacklog; ++i) REQUIRE(writer.try_push(make_entry<SubmitEntry>(i)));

  // A busy ring: the head moves in steps of kPublishEvery, never further behind.
  SubmitEntry entry;
  for (uint64_t i = 1; i < kBacklog; ++i) {
    REQUIRE(reader.try_pop(&entry) == PopResult::kOk);
    REQUIRE(entry_is(entry, i - 1));
    REQUIRE(ring->cursor.head.load() == i - i % Reader::kPublishEvery);
  }
  // The last entry it saw: published at once, so the producer sees an empty ring.
  REQUIRE(reader.try_pop(&entry) == PopResult::kOk);
  CHECK(ring->cursor.head.load() == kBacklog);
  CHECK(reader.try_pop(&entry) == PopResult::kEmpty);

  // A full ring: the first pop frees a slot the producer sees.
  while (writer.try_push(make_entry<SubmitEntry>(0))) {
  }
  CHECK(ring->data.tail.load() == kBacklog + SubmitRing::capacity);
  REQUIRE(reader.try_pop(&entry) == PopResult::kOk);
  CHECK(ring->cursor.head.load() == kBacklog + 1);
  CHECK(writer.try_push(make_entry<SubmitEntry>(0)));
}

// What a channel puts next to a ring: the doorbell the consumer sleeps on.
template <class Ring>
struct SharedRing {
  Ring ring;
  alignas(64) WakeWord data;  // the producer notifies it after a batch of pushes
};

TEMPLATE_TEST_CASE("entries pushed by a child process arrive exactly once and in order", "[ring][fork]", TestRing,
                   SubmitRing) {
  using Entry = typename TestType::EntryType;
  constexpr uint64_t kEntries = 100000;
  SharedObject<SharedRing<TestType>> shared;

  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The producer. No Catch2 here: report through the exit status and leave with _exit so that
    // nothing of the parent's (Catch2's state, atexit handlers) runs twice.
    RingWriter<TestType> writer(&shared->ring);
    uint64_t next = 0;
    while (next < kEntries) {
      while (next < kEntries && writer.try_push(make_entry<Entry>(next))) ++next;
      // Notify before sleeping: otherwise both sides could sleep, each waiting for the other.
      shared->data.notify();
      if (next == kEntries) break;
      const bool has_space =
          writer.space().wait_until([&] { return !writer.full(); }, steady_clock::now() + kHangGuard);
      if (!has_space) _exit(2);
    }
    _exit(0);
  }

  RingReader<TestType> reader(&shared->ring);
  uint64_t received = 0;
  bool in_order = true;
  bool timed_out = false;
  bool corrupt = false;
  while (received < kEntries) {
    Entry entry;
    const PopResult result = reader.try_pop(&entry);
    if (result == PopResult::kOk) {
      if (!entry_is(entry, received)) {
        in_order = false;
        break;
      }
      ++received;
    } else if (result == PopResult::kEmpty) {
      if (!shared->data.wait_until([&] { return !reader.empty(); }, steady_clock::now() + kHangGuard)) {
        timed_out = true;
        break;
      }
    } else {
      corrupt = true;
      break;
    }
  }
  // On failure the child may still be blocked on a full ring; don't leave it behind.
  if (received < kEntries) kill(child, SIGKILL);

  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(in_order);
  CHECK_FALSE(timed_out);
  CHECK_FALSE(corrupt);
  CHECK(received == kEntries);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // Nothing beyond the last entry: each one arrived exactly once.
  CHECK(reader.empty());
  CHECK(shared->ring.data.tail.load() == kEntries);
}

TEST_CASE("wait_until returns false at the deadline when never notified", "[wake_word]") {
  WakeWord word;
  constexpr auto kTimeout = 50ms;
  const auto start = steady_clock::now();
  const bool ready = word.wait_until([] { return false; }, start + kTimeout);
  const auto waited = steady_clock::now() - start;
  CHECK_FALSE(ready);
  CHECK(waited >= kTimeout);  // no upper bound: a loaded machine may oversleep
}

TEST_CASE("wait_until returns true at once when already ready, even past its deadline", "[wake_word]") {
  WakeWord word;
  CHECK(word.wait_until([] { return true; }, steady_clock::now() - 1s));
  CHECK(word.waiters.load() == 0);
}

TEST_CASE("wait_until returns true after a notify from another thread", "[wake_word]") {
  WakeWord word;
  std::atomic<bool> published{false};

  std::thread notifier([&] {
    // Publish only once the waiter has registered, so the wake-up path (not the first
    // check) is what ends the wait. Bounded, in case the waiter never gets that far.
    const auto give_up = steady_clock::now() + kHangGuard;
    while (word.waiters.load() == 0 && steady_clock::now() < give_up) std::this_thread::yield();
    published.store(true);
    word.notify();
  });

  const auto start = steady_clock::now();
  const bool ready = word.wait_until([&] { return published.load(); }, start + kHangGuard);
  const auto waited = steady_clock::now() - start;
  notifier.join();

  CHECK(ready);
  // The only timing claim: the wake-up, not the deadline, ended the wait.
  CHECK(waited < kHangGuard);
  CHECK(word.waiters.load() == 0);
}

TEST_CASE("a scribbled wake word cannot make a wait outlast its deadline", "[wake_word]") {
  WakeWord word;
  word.seq.store(0xffffffffu);
  word.waiters.store(0xffffffffu);
  const auto start = steady_clock::now();
  CHECK_FALSE(word.wait_until([] { return false; }, start + 20ms));
  CHECK(steady_clock::now() - start < kHangGuard);
}

}  // namespace
}  // namespace gradsync
