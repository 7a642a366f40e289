// The CUDA backend's orchestration without a GPU: the legacy IPC memory cache and the event
// rings, driven through a fake DeviceApi that counts what was opened and closed, and fails on
// demand.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/backend/cuda/events.h"
#include "daemon/backend/cuda/ipc_cache.h"

namespace gradsync::cuda {
namespace {

IpcHandle handle(unsigned char tag) {
  IpcHandle h{};
  h.fill(tag);
  return h;
}

class FakeDeviceApi final : public DeviceApi {
 public:
  Status open_ipc_memory(int device, const IpcHandle& h, void** base) override {
    if (fail_opening == h[0]) return Status::internal("invalid resource handle");
    ++memory_opens;
    *base = reinterpret_cast<void*>(0x1000 * (h[0] + 1) + device);
    open_memory.insert(*base);
    return Status();
  }
  Status close_ipc_memory(int, void* base) override {
    CHECK(open_memory.erase(base) == 1);  // closed exactly once, and only what was opened
    return Status();
  }
  Status open_ipc_event(int, const IpcHandle& h, void** event) override {
    if (fail_opening == h[0]) return Status::internal("invalid resource handle");
    *event = reinterpret_cast<void*>(0x10 * (h[0] + 1));
    open_events.insert(*event);
    return Status();
  }
  Status destroy_event(int, void* event) override {
    CHECK(open_events.erase(event) == 1);
    return Status();
  }
  Status stream_wait_event(void* stream, void* event) override {
    calls.push_back("wait " + std::to_string(reinterpret_cast<uintptr_t>(event)) + " on " +
                    std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return Status();
  }
  Status record_event(void* event, void* stream) override {
    calls.push_back("record " + std::to_string(reinterpret_cast<uintptr_t>(event)) + " on " +
                    std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return Status();
  }

  int fail_opening = -1;  // the tag of a handle that fails to open
  int memory_opens = 0;
  std::set<void*> open_memory;
  std::set<void*> open_events;
  std::vector<std::string> calls;
};

std::vector<IpcHandle> ring_handles() {
  std::vector<IpcHandle> handles;
  for (uint32_t i = 0; i < kEventsPerDirection; ++i) handles.push_back(handle(static_cast<unsigned char>(i)));
  return handles;
}

}  // namespace

TEST_CASE("ipc cache: one allocation is opened once, shared, and closed with its last holder", "[cuda][ipc]") {
  FakeDeviceApi api;
  IpcMemoryCache cache(&api);
  std::shared_ptr<OpenedIpcMemory> a, b, c;
  REQUIRE(cache.acquire(0, handle(1), &a).ok());
  REQUIRE(cache.acquire(0, handle(1), &b).ok());  // a second tensor in the same allocation
  CHECK(a == b);
  CHECK(api.memory_opens == 1);
  REQUIRE(cache.acquire(0, handle(2), &c).ok());  // another allocation
  CHECK(api.memory_opens == 2);
  CHECK(cache.open_count() == 2);
  a.reset();
  CHECK(api.open_memory.size() == 2);  // b still holds it
  b.reset();
  CHECK(api.open_memory.size() == 1);
  CHECK(cache.open_count() == 1);
  // Reopened after its last holder went: a new registration of the same allocation.
  REQUIRE(cache.acquire(0, handle(1), &a).ok());
  CHECK(api.memory_opens == 3);
  a.reset();
  c.reset();
  CHECK(api.open_memory.empty());
}

TEST_CASE("ipc cache: the same handle on two devices is two openings; a failure names the device",
          "[cuda][ipc]") {
  FakeDeviceApi api;
  IpcMemoryCache cache(&api);
  std::shared_ptr<OpenedIpcMemory> on0, on1, bad;
  REQUIRE(cache.acquire(0, handle(1), &on0).ok());
  REQUIRE(cache.acquire(1, handle(1), &on1).ok());
  CHECK(on0 != on1);
  api.fail_opening = 7;
  const Status status = cache.acquire(3, handle(7), &bad);
  CHECK(status.code() == ErrorCode::kInternal);
  CHECK(status.message() == "opening a CUDA IPC memory handle on device 3: invalid resource handle");
  CHECK_FALSE(bad);
  CHECK(cache.open_count() == 2);
}

TEST_CASE("event ring: operation seq uses slot seq % K in both directions", "[cuda][events]") {
  FakeDeviceApi api;
  std::unique_ptr<EventRing> ring;
  const std::vector<IpcHandle> handles = ring_handles();
  REQUIRE(EventRing::open(&api, 0, handles, &ring).ok());
  CHECK(api.open_events.size() == kEventsPerDirection);
  void* stream = reinterpret_cast<void*>(7);
  REQUIRE(ring->wait(1, stream).ok());
  REQUIRE(ring->record(1, stream).ok());
  REQUIRE(ring->wait(1 + kEventsPerDirection, stream).ok());
  // Slot 1's event is 0x10 * (1 + 1) = 32 in the fake.
  CHECK(api.calls == std::vector<std::string>{"wait 32 on 7", "record 32 on 7", "wait 32 on 7"});
  CHECK(EventRing::slot(kEventsPerDirection - 1) == kEventsPerDirection - 1);
  CHECK(EventRing::slot(kEventsPerDirection) == 0);
  ring.reset();
  CHECK(api.open_events.empty());
}

TEST_CASE("event ring: a handle that fails to open destroys the ones opened, naming the slot", "[cuda][events]") {
  FakeDeviceApi api;
  api.fail_opening = 5;
  std::unique_ptr<EventRing> ring;
  const Status status = EventRing::open(&api, 2, ring_handles(), &ring);
  CHECK(status.message() == "opening interprocess event 5 of " + std::to_string(kEventsPerDirection) +
                                " on device 2: invalid resource handle");
  CHECK_FALSE(ring);
  CHECK(api.open_events.empty());  // slots 0-4 were destroyed again
  const std::vector<IpcHandle> too_few(3);
  CHECK_THAT(EventRing::open(&api, 0, too_few, &ring).message(),
             Catch::Contains("needs " + std::to_string(kEventsPerDirection) + " event handles, got 3"));
}

}  // namespace gradsync::cuda
