// A DeviceApi whose "device memory" is host memory and whose streams do nothing, and a
// KernelLauncher that runs the kernels' functors over that memory on the host: with them the
// CUDA executor runs, tables and all, on a machine without a GPU, and its results can be
// compared with the host reduction bit for bit.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "daemon/backend/cuda/device_api.h"
#include "daemon/backend/cuda/launcher.h"
#include "daemon/model/memory.h"

namespace gradsync::cuda::testing {

// GPU semantics the containment tests rely on: a stream that waits on a client event marked
// `never_fires` is blocked for good; an event recorded on a blocked stream is never through; a
// synchronisation of a blocked stream would hang (counted, not waited). Every object remembers
// its device, and a call that names another device is counted in wrong_device_calls. A device
// put in `broken` fails every later call on it, as a sticky error does, and health() says why.
// Thread-safe: two executors (two jobs on one GPU) may share it.
class HostBackedDeviceApi final : public DeviceApi {
 public:
  ~HostBackedDeviceApi() override {
    for (auto& [p, bytes] : allocations) std::free(p);
  }
  Status device_of_uuid(const std::string&, int*) override { return Status::not_supported("fake"); }
  Status import_vmm(int, int, uint64_t*, int*) override { return Status::not_supported("fake"); }
  Status release_vmm_handle(int, uint64_t) override { return Status::not_supported("fake"); }
  Status map_vmm(int, uint64_t, size_t, void**) override { return Status::not_supported("fake"); }
  Status release_vmm(int, void*, size_t, uint64_t) override { return Status::not_supported("fake"); }
  Status allocation_size(int, void*, size_t*) override { return Status::not_supported("fake"); }
  Status open_ipc_memory(int, const IpcHandle&, void**) override { return Status::not_supported("fake"); }
  Status close_ipc_memory(int, void*) override { return Status::not_supported("fake"); }
  // Interprocess events are named "<name_prefix>.<n>", n counting from 0 per prefix: a test that
  // sets the prefix to "r0" before creating client 0's ready ring sees slot 5 as "r0.5".
  Status create_ipc_event(int device, void** event, IpcHandle* handle) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    if (name_prefix != last_prefix_) {
      last_prefix_ = name_prefix;
      made_with_prefix_ = 0;
    }
    names.push_back(name_prefix + "." + std::to_string(made_with_prefix_++));
    *event = reinterpret_cast<void*>(names.size());  // 1-based index into names
    device_of_[*event] = device;
    handle->fill(static_cast<unsigned char>(names.size()));
    ++events;
    return Status();
  }
  // Events of the daemon's own: the fake's work is done when it is enqueued, so a query says
  // done unless a test holds the events back (a GPU still busy) or the event was recorded on a
  // blocked stream.
  Status create_event(int device, void** event) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    *event = reinterpret_cast<void*>(0x100000 + ++own_events_made_);
    device_of_[*event] = device;
    ++events;
    return Status();
  }
  Status destroy_event(int device, void* event) override {
    std::lock_guard lock(mutex_);
    check_device(device, event);
    --events;
    return Status();
  }
  Status query_event(int device, void* event, bool* done) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, event);
    const std::string name = name_of(event);
    *done = !events_pending.load() && !never_done_.count(event) && !never_fires.count(name);
    // Queries of clients' events are traced (the daemon's own are polled any number of times).
    if (trace && name != "own") trace->push_back("query " + name + (*done ? "" : " (not yet)"));
    return Status();
  }
  Status stream_wait_event(int device, void* stream, void* event) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, stream);
    if (trace) trace->push_back("wait " + name_of(event));
    if (name_of(event) != "own") ++client_event_waits;
    if (never_fires.count(name_of(event)) || never_done_.count(event)) blocked_.insert(stream);
    return Status();
  }
  Status record_event(int device, void* event, void* stream) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, stream);
    check_device(device, event);
    ++records;
    if (trace) trace->push_back("record " + name_of(event));
    if (blocked_.count(stream)) {
      never_done_.insert(event);
    } else {
      never_done_.erase(event);
    }
    return Status();
  }
  std::string name_of(void* event) const {
    const auto index = reinterpret_cast<uintptr_t>(event);
    return index >= 1 && index <= names.size() ? names[index - 1] : "own";
  }

  Status make_current(int device) override {
    std::lock_guard lock(mutex_);
    return gate(device);
  }
  Status allocate(int device, size_t bytes, void* stream, void** memory) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, stream);
    *memory = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    allocations[*memory] = bytes;
    return Status();
  }
  Status free(int device, void* memory, void* stream) override {
    std::lock_guard lock(mutex_);
    check_device(device, stream);
    if (allocations.erase(memory) != 1) return Status::internal("freeing memory that was not allocated");
    std::free(memory);
    return Status();
  }
  Status upload(int device, void* to, const void* from, size_t bytes, void* stream) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, stream);
    ++uploads;
    std::memcpy(to, from, bytes);
    return Status();
  }
  Status download(int device, void* to, const void* from, size_t bytes, void* stream) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, stream);
    ++downloads;
    std::memcpy(to, from, bytes);
    return Status();
  }
  Status zero(int device, void* at, size_t bytes, void* stream) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    check_device(device, stream);
    ++zeroings;
    std::memset(at, 0, bytes);
    return Status();
  }
  Status trim(int) override {
    ++trims;
    return Status();
  }
  Status create_stream(int device, void** stream) override {
    std::lock_guard lock(mutex_);
    if (Status s = gate(device); !s.ok()) return s;
    *stream = reinterpret_cast<void*>(0x200000 + ++streams_made_);
    device_of_[*stream] = device;
    ++streams;
    return Status();
  }
  Status destroy_stream(int device, void* stream) override {
    std::lock_guard lock(mutex_);
    check_device(device, stream);
    --streams;
    return Status();
  }
  // With events_pending, or on a blocked stream, the GPU is stuck: a real synchronisation would
  // never return, so the fake counts it as one that hung.
  Status synchronize(int device, void* stream) override {
    std::lock_guard lock(mutex_);
    check_device(device, stream);
    ++synchronizations;
    if (events_pending.load() || blocked_.count(stream)) ++stuck_synchronizations;
    return gate(device);
  }
  Status health(int device) override {
    std::lock_guard lock(mutex_);
    auto it = broken.find(device);
    return it == broken.end() ? Status() : it->second;
  }
  // A sticky error on `device` from now on.
  void break_device(int device, const std::string& cuda_error) {
    std::lock_guard lock(mutex_);
    broken[device] = Status::internal("GPU " + std::to_string(device) + " is unusable: " + cuda_error);
  }

  std::map<void*, size_t> allocations;
  std::vector<std::string> names;               // created interprocess events
  std::string name_prefix = "ev";
  std::vector<std::string>* trace = nullptr;    // waits, records and launches, in order
  std::atomic<bool> events_pending{false};
  std::set<std::string> never_fires;            // client events (by name) whose record never completes
  std::map<int, Status> broken;                 // devices a sticky error broke
  int events = 0;
  int records = 0;
  std::string last_prefix_;
  int made_with_prefix_ = 0;
  int uploads = 0;
  int downloads = 0;
  int zeroings = 0;
  std::atomic<int> trims{0};
  int streams = 0;
  int synchronizations = 0;
  int stuck_synchronizations = 0;
  std::atomic<int> wrong_device_calls{0};
  std::atomic<int> client_event_waits{0};  // streams made to wait on a client's event

 private:
  Status gate(int device) const {
    auto it = broken.find(device);
    return it == broken.end() ? Status() : Status::internal("cudaErrorIllegalAddress: an illegal memory access was encountered");
  }
  void check_device(int device, void* object) {
    auto it = device_of_.find(object);
    if (it != device_of_.end() && it->second != device) ++wrong_device_calls;
  }
  std::mutex mutex_;
  std::map<void*, int> device_of_;  // streams and events
  std::set<void*> blocked_;         // streams waiting for good
  std::set<void*> never_done_;      // events recorded on a blocked stream
  int own_events_made_ = 0;
  int streams_made_ = 0;
};

class HostKernelLauncher final : public KernelLauncher {
 public:
  Status gather(const reduce::KernelArgs& args, const BucketTable& table, void*) override {
    ++gathers;
    if (trace) trace->push_back("gather");
    dispatch(args, [&]<typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRound>() {
      using Acc = typename Codec::Acc;
      const Acc divisor = kScale == reduce::Scale::kNone ? Acc{1} : static_cast<Acc>(args.divisor);
      run(GatherItem<Codec, kCombine, kScale, kRound>{divisor}, table);
    });
    return Status();
  }
  Status scatter(const reduce::KernelArgs& args, const BucketTable& table, void*) override {
    ++scatters;
    if (trace) trace->push_back("scatter");
    dispatch(args, [&]<typename Codec, reduce::Combine kCombine, reduce::Scale kScale, bool kRound>() {
      using Acc = typename Codec::Acc;
      constexpr reduce::Scale kAfter = kCombine == reduce::Combine::kSum ? kScale : reduce::Scale::kNone;
      const Acc divisor = kAfter == reduce::Scale::kNone ? Acc{1} : static_cast<Acc>(args.divisor);
      run(ScatterItem<Codec, kAfter, kRound>{divisor}, table);
    });
    return Status();
  }
  Status health(DType dtype, const HealthTable& table, void*) override {
    ++healths;
    if (trace) trace->push_back("health");
    return dispatch_health(dtype, [&]<typename Codec>() {
      for (uint64_t i = 0; i < table.item_count; ++i) table.out[table.items[i].out] = health_of_item<Codec>(table.items[i]);
      return Status();
    });
  }
  Status preload(int* loaded) override {
    *loaded = 0;
    return Status();
  }
  int gathers = 0;
  int scatters = 0;
  int healths = 0;
  std::vector<std::string>* trace = nullptr;

 private:
  template <typename Functor>
  static void run(const Functor& functor, const BucketTable& table) {
    for (uint64_t item = 0; item < table.item_count; ++item) {
      for (uint32_t lane = 0; lane < 4; ++lane) functor(table, item, lane, 4);
    }
  }
};

// A client's tensors "on" a GPU: host memory that says it is device memory.
class FakeDeviceRegion final : public MemoryRegion {
 public:
  FakeDeviceRegion(std::byte* base, size_t size, int device) : base_(base), size_(size), device_(device) {}
  MemoryKind kind() const override { return MemoryKind::kCudaVmm; }
  size_t size() const override { return size_; }
  std::byte* base() const override { return base_; }
  int device() const override { return device_; }

 private:
  std::byte* base_;
  size_t size_;
  int device_;
};

}  // namespace gradsync::cuda::testing
