// A DeviceApi whose "device memory" is host memory and whose streams do nothing, and a
// KernelLauncher that runs the kernels' functors over that memory on the host: with them the
// CUDA executor runs, tables and all, on a machine without a GPU, and its results can be
// compared with the host reduction bit for bit.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "daemon/backend/cuda/device_api.h"
#include "daemon/backend/cuda/launcher.h"
#include "daemon/backend/memory.h"

namespace gradsync::cuda::testing {

class HostBackedDeviceApi final : public DeviceApi {
 public:
  ~HostBackedDeviceApi() override {
    for (auto& [p, bytes] : allocations) std::free(p);
  }
  Status device_of_uuid(const std::string&, int*) override { return Status::not_supported("fake"); }
  Status import_vmm(int, int, size_t, void**, uint64_t*) override { return Status::not_supported("fake"); }
  Status release_vmm(int, void*, size_t, uint64_t) override { return Status::not_supported("fake"); }
  Status allocation_size(int, void*, size_t*) override { return Status::not_supported("fake"); }
  Status open_ipc_memory(int, const IpcHandle&, void**) override { return Status::not_supported("fake"); }
  Status close_ipc_memory(int, void*) override { return Status::not_supported("fake"); }
  // Interprocess events are named "<name_prefix>.<n>", n counting from 0 per prefix: a test that
  // sets the prefix to "r0" before creating client 0's ready ring sees slot 5 as "r0.5".
  Status create_ipc_event(int, void** event, IpcHandle* handle) override {
    if (name_prefix != last_prefix_) {
      last_prefix_ = name_prefix;
      made_with_prefix_ = 0;
    }
    names.push_back(name_prefix + "." + std::to_string(made_with_prefix_++));
    *event = reinterpret_cast<void*>(names.size());  // 1-based index into names
    handle->fill(static_cast<unsigned char>(names.size()));
    ++events;
    return Status();
  }
  // Events of the daemon's own: the fake's work is done when it is enqueued, so a query says
  // done unless a test holds the events back (a GPU still busy).
  Status create_event(int, void** event) override {
    *event = reinterpret_cast<void*>(0x1000 + ++events);
    return Status();
  }
  Status destroy_event(int, void*) override {
    --events;
    return Status();
  }
  Status query_event(int, void*, bool* done) override {
    *done = !events_pending.load();
    return Status();
  }
  Status stream_wait_event(void*, void* event) override {
    if (trace) trace->push_back("wait " + name_of(event));
    return Status();
  }
  Status record_event(void* event, void*) override {
    ++records;
    if (trace) trace->push_back("record " + name_of(event));
    return Status();
  }
  std::string name_of(void* event) const {
    const auto index = reinterpret_cast<uintptr_t>(event);
    return index >= 1 && index <= names.size() ? names[index - 1] : "own";
  }

  Status make_current(int) override { return Status(); }
  Status allocate(int, size_t bytes, void** memory) override {
    *memory = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    allocations[*memory] = bytes;
    return Status();
  }
  Status free(int, void* memory) override {
    if (allocations.erase(memory) != 1) return Status::internal("freeing memory that was not allocated");
    std::free(memory);
    return Status();
  }
  Status upload(int, void* to, const void* from, size_t bytes) override {
    ++uploads;
    std::memcpy(to, from, bytes);
    return Status();
  }
  Status create_stream(int, void** stream) override {
    *stream = reinterpret_cast<void*>(++streams);
    return Status();
  }
  Status destroy_stream(int, void*) override {
    --streams;
    return Status();
  }
  // With events_pending the GPU is stuck: a real synchronisation would never return, so the
  // fake counts it as one that hung.
  Status synchronize(void*) override {
    ++synchronizations;
    if (events_pending.load()) ++stuck_synchronizations;
    return Status();
  }

  std::map<void*, size_t> allocations;
  std::vector<std::string> names;               // created interprocess events
  std::string name_prefix = "ev";
  std::vector<std::string>* trace = nullptr;    // waits, records and launches, in order
  std::atomic<bool> events_pending{false};
  int events = 0;
  int records = 0;
  std::string last_prefix_;
  int made_with_prefix_ = 0;
  int uploads = 0;
  int streams = 0;
  int synchronizations = 0;
  int stuck_synchronizations = 0;
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
  int gathers = 0;
  int scatters = 0;
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
