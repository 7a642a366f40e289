// The CUDA backend's orchestration without a GPU: the legacy IPC memory cache and the event
// rings, driven through a fake DeviceApi that counts what was opened and closed, and fails on
// demand.
#include <catch2/catch.hpp>

#include "daemon/backend/factory.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/backend/cuda/events.h"
#include "daemon/backend/cuda/ipc_cache.h"
#include "daemon/backend/cuda/memory.h"

namespace gradsync::cuda {
namespace {

IpcHandle handle(unsigned char tag) {
  IpcHandle h{};
  h.fill(tag);
  return h;
}

class FakeDeviceApi final : public DeviceApi {
 public:
  // GPUs by UUID: "uuid-of-gpu0-xxx" (16 bytes) is device 0, and so on.
  static std::string uuid_of(int device) { return "uuid-of-gpu" + std::to_string(device) + "-xxx"; }

  Status device_of_uuid(const std::string& uuid, int* device) override {
    for (int d = 0; d < 2; ++d) {
      if (uuid == uuid_of(d)) {
        *device = d;
        return Status();
      }
    }
    return Status::not_found("no GPU with the client's UUID is visible to gradsyncd (it sees 2)");
  }
  // The allocation behind descriptor `fd` lives on GPU located_on[fd], or on the GPU the client
  // named when the map has no entry.
  Status import_vmm(int device, int fd, uint64_t* handle, int* located) override {
    if (fail_import) return Status::internal("cuMemImportFromShareableHandle failed with CUDA driver error 1");
    *handle = static_cast<uint64_t>(fd) + 1000;
    *located = located_on.count(fd) ? located_on[fd] : device;
    imported_handles.insert(*handle);
    return Status();
  }
  Status release_vmm_handle(int, uint64_t handle) override {
    CHECK(imported_handles.erase(handle) == 1);
    return Status();
  }
  Status map_vmm(int device, uint64_t handle, size_t bytes, void** address) override {
    CHECK(imported_handles.count(handle) == 1);
    *address = reinterpret_cast<void*>(0x100000 * (++vmm_imports) + device);
    mapped_vmm[*address] = bytes;
    return Status();
  }
  Status release_vmm(int, void* address, size_t bytes, uint64_t handle) override {
    CHECK(mapped_vmm.count(address) == 1);
    CHECK(mapped_vmm[address] == bytes);
    mapped_vmm.erase(address);
    CHECK(imported_handles.erase(handle) == 1);
    return Status();
  }
  Status allocation_size(int, void*, size_t* bytes) override {
    *bytes = allocation_bytes;
    return Status();
  }
  // Not used by the cache, the rings or the import.
  Status make_current(int) override { return Status::not_supported("fake"); }
  Status allocate(int, size_t, void*, void**) override { return Status::not_supported("fake"); }
  Status free(int, void*, void*) override { return Status::not_supported("fake"); }
  Status upload(int, void*, const void*, size_t, void*) override { return Status::not_supported("fake"); }
  Status download(int, void*, const void*, size_t, void*) override { return Status::not_supported("fake"); }
  Status zero(int, void*, size_t, void*) override { return Status::not_supported("fake"); }
  Status trim(int) override { return Status::not_supported("fake"); }
  Status create_stream(int, void**) override { return Status::not_supported("fake"); }
  Status destroy_stream(int, void*) override { return Status::not_supported("fake"); }
  Status synchronize(int, void*) override { return Status::not_supported("fake"); }
  Status health(int) override { return Status(); }
  Status create_event(int, void**) override { return Status::not_supported("fake"); }
  Status query_event(int, void*, bool*) override { return Status::not_supported("fake"); }
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
  Status create_ipc_event(int, void** event, IpcHandle* handle) override {
    const int index = events_made++;
    if (fail_creating == index) return Status::internal("out of memory");
    *event = reinterpret_cast<void*>(0x10 * (index + 1));
    handle->fill(static_cast<unsigned char>(index));
    open_events.insert(*event);
    return Status();
  }
  Status destroy_event(int, void* event) override {
    CHECK(open_events.erase(event) == 1);
    return Status();
  }
  Status stream_wait_event(int, void* stream, void* event) override {
    calls.push_back("wait " + std::to_string(reinterpret_cast<uintptr_t>(event)) + " on " +
                    std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return Status();
  }
  Status record_event(int, void* event, void* stream) override {
    calls.push_back("record " + std::to_string(reinterpret_cast<uintptr_t>(event)) + " on " +
                    std::to_string(reinterpret_cast<uintptr_t>(stream)));
    return Status();
  }

  int fail_opening = -1;  // the tag of a memory handle that fails to open
  int fail_creating = -1;  // the index of an event that fails to be created
  int events_made = 0;
  bool fail_import = false;
  int vmm_imports = 0;
  std::map<int, int> located_on;     // fd -> the GPU its allocation lives on
  std::set<uint64_t> imported_handles;  // imported, not released yet
  std::map<void*, size_t> mapped_vmm;
  size_t allocation_bytes = 1 << 20;
  int memory_opens = 0;
  std::set<void*> open_memory;
  std::set<void*> open_events;
  std::vector<std::string> calls;
};

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

TEST_CASE("ipc cache: the same handle on two devices is two openings, a failure names the device",
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
  REQUIRE(EventRing::create(&api, 0, &ring).ok());
  CHECK(api.open_events.size() == kEventsPerDirection);
  REQUIRE(ring->handles().size() == kEventsPerDirection);
  CHECK(ring->handles()[5][0] == 5);  // each slot's own handle, for the client to open
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

TEST_CASE("event ring: an event that cannot be made destroys the ones made, naming the slot", "[cuda][events]") {
  FakeDeviceApi api;
  api.fail_creating = 5;
  std::unique_ptr<EventRing> ring;
  const Status status = EventRing::create(&api, 2, &ring);
  CHECK(status.message() == "creating interprocess event 5 of " + std::to_string(kEventsPerDirection) +
                                " on device 2: out of memory");
  CHECK_FALSE(ring);
  CHECK(api.open_events.empty());  // slots 0-4 were destroyed again
}

namespace {

MemoryImport device_import(MemoryKind kind, int device, uint64_t bytes, unsigned char tag = 1, uint64_t offset = 0) {
  MemoryImport what;
  what.kind = kind;
  what.bytes = bytes;
  what.device_uuid = FakeDeviceApi::uuid_of(device);
  if (kind == MemoryKind::kCudaLegacyIpc) {
    const IpcHandle h = handle(tag);
    what.ipc_handle.assign(reinterpret_cast<const char*>(h.data()), h.size());
    what.ipc_offset = offset;
  }
  return what;
}

}  // namespace

TEST_CASE("device memory: a VMM segment is mapped on the GPU its UUID names, and unmapped with its region",
          "[cuda][memory]") {
  FakeDeviceApi api;
  IpcMemoryCache ipc(&api);
  std::shared_ptr<MemoryRegion> region;
  REQUIRE(import_device_memory(&api, &ipc, device_import(MemoryKind::kCudaVmm, 1, 2 << 20), &region).ok());
  CHECK(region->kind() == MemoryKind::kCudaVmm);
  CHECK(region->device() == 1);
  CHECK(region->size() == (2u << 20));
  CHECK(api.mapped_vmm.size() == 1);
  region.reset();
  CHECK(api.mapped_vmm.empty());
  CHECK(api.imported_handles.empty());
}

TEST_CASE("device memory: an unknown GPU or a failed import is refused, naming it", "[cuda][memory]") {
  FakeDeviceApi api;
  IpcMemoryCache ipc(&api);
  std::shared_ptr<MemoryRegion> region;
  CHECK(import_device_memory(&api, &ipc, device_import(MemoryKind::kCudaVmm, 7, 4096), &region).message() ==
        "CUDA VMM segment: no GPU with the client's UUID is visible to gradsyncd (it sees 2)");
  api.fail_import = true;
  CHECK(import_device_memory(&api, &ipc, device_import(MemoryKind::kCudaVmm, 0, 4096), &region).message() ==
        "CUDA VMM segment on device 0: cuMemImportFromShareableHandle failed with CUDA driver error 1");
  CHECK_FALSE(region);
  CHECK(api.mapped_vmm.empty());
}

TEST_CASE("device memory: a VMM allocation on another GPU than the one the client named is refused, and released",
          "[cuda][memory]") {
  // A client names GPU 1 by UUID but passes an allocation that lives on GPU 0: mapping it would
  // reach GPU 0's memory through peer access and launch on the wrong GPU's streams.
  FakeDeviceApi api;
  IpcMemoryCache ipc(&api);
  std::shared_ptr<MemoryRegion> region;
  MemoryImport what = device_import(MemoryKind::kCudaVmm, 1, 2 << 20);
  api.located_on[what.fd.get()] = 0;
  const Status status = import_device_memory(&api, &ipc, std::move(what), &region);
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  CHECK(status.message() == "CUDA VMM segment on device 1: the allocation lives on GPU 0, not on the GPU whose "
                            "UUID the client named");
  CHECK_FALSE(region);
  CHECK(api.mapped_vmm.empty());
  CHECK(api.imported_handles.empty());  // the import was released
}

TEST_CASE("device memory: legacy IPC pieces share one opening and must lie inside their allocation",
          "[cuda][memory]") {
  FakeDeviceApi api;
  IpcMemoryCache ipc(&api);
  std::shared_ptr<MemoryRegion> first, second, outside;
  REQUIRE(import_device_memory(&api, &ipc, device_import(MemoryKind::kCudaLegacyIpc, 0, 4096, 3, 0), &first).ok());
  REQUIRE(import_device_memory(&api, &ipc, device_import(MemoryKind::kCudaLegacyIpc, 0, 4096, 3, 8192), &second).ok());
  CHECK(api.memory_opens == 1);  // two tensors of one caching-allocator segment: one open
  CHECK(second->base() - first->base() == 8192);
  CHECK(second->kind() == MemoryKind::kCudaLegacyIpc);
  // 1 MiB allocation: a piece that runs past its end is refused.
  const Status status =
      import_device_memory(&api, &ipc, device_import(MemoryKind::kCudaLegacyIpc, 0, 8192, 3, (1 << 20) - 4096), &outside);
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  CHECK(status.message() == "CUDA legacy IPC segment: offset 1044480 + 8192 bytes lies outside the allocation of "
                            "1048576 bytes");
  first.reset();
  CHECK(api.open_memory.size() == 1);  // the second piece keeps the allocation open
  second.reset();
  CHECK(api.open_memory.empty());
}

TEST_CASE("backend factory: device events need a GPU, and say so", "[cuda][events]") {
  // The daemon's real factory makes the rings itself (a client never names an event handle);
  // without a usable GPU it says why. On a machine with one this makes real events.
  const auto backends = make_backend_factory(Logger(LogLevel::kError), nullptr);
  std::shared_ptr<const ClientEvents> events;
  const Status s = backends->create_events(0, &events);
  if (s.code() == ErrorCode::kNotSupported) {
    CHECK_THAT(s.message(), Catch::StartsWith("device events: "));
    CHECK(events == nullptr);
  } else {
    REQUIRE(s.ok());
    CHECK(events->ready_handles().size() == kDeviceEventsPerDirection);
    CHECK(events->done_handles().size() == kDeviceEventsPerDirection);
  }
}

}  // namespace gradsync::cuda

namespace gradsync::cuda {

TEST_CASE("backend factory: memory kept for undrained GPU work is held, and said to be, for the daemon's life",
          "[cuda][memory]") {
  const auto backends = make_backend_factory(Logger(LogLevel::kError), nullptr);
  CHECK_FALSE(backends->keeps_undrained_memory());
  auto memory = std::make_shared<int>(7);
  const std::weak_ptr<int> watched = memory;
  backends->keep_until_exit(std::move(memory));
  // The factory holds it (gradsyncd then ends without tearing the factory down: daemon_main.cc).
  CHECK(backends->keeps_undrained_memory());
  CHECK_FALSE(watched.expired());
}

}  // namespace gradsync::cuda
