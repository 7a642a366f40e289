#include "client/src/cuda_events.h"

#include <thread>

#include "shared/channel_layout.h"

namespace gradsync {
namespace {

class CudaDeviceEvents final : public DeviceEvents {
 public:
  // The driver's entry points are copied: a Work may keep these events after its Client is gone.
  CudaDeviceEvents(const Driver& d, CUdevice device) : driver_(d), device_(device) {}

  ~CudaDeviceEvents() override {
    ScopedPrimaryContext context(d_, device_);
    if (!context.status().ok()) return;
    // Whatever the daemon or this process still has queued on them finishes first: an event
    // destroyed while in use is undefined behaviour.
    if (announce_) {
      d_->stream_destroy(announce_);
    }
    for (CUevent e : ready_) d_->event_destroy(e);
    for (CUevent e : done_) d_->event_destroy(e);
    if (local_) d_->event_destroy(local_);
  }

  Status create() {
    ScopedPrimaryContext context(d_, device_);
    if (!context.status().ok()) return context.status();
    if (Status s = d_->check(d_->stream_create(&announce_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); !s.ok()) return s;
    if (Status s = d_->check(d_->event_create(&local_, CU_EVENT_DISABLE_TIMING), "cuEventCreate"); !s.ok()) return s;
    for (auto* ring : {&ready_, &done_}) {
      auto* handles = ring == &ready_ ? &ready_handles_ : &done_handles_;
      for (uint32_t i = 0; i < kDeviceEventsPerDirection; ++i) {
        CUevent event = nullptr;
        if (Status s = d_->check(d_->event_create(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
                                 "cuEventCreate (interprocess)");
            !s.ok()) {
          return s;
        }
        ring->push_back(event);
        CUipcEventHandle handle{};
        if (Status s = d_->check(d_->ipc_get_event_handle(&handle, event), "cuIpcGetEventHandle"); !s.ok()) return s;
        handles->emplace_back(handle.reserved, sizeof(handle.reserved));
      }
    }
    return Status();
  }

  const std::vector<std::string>& ready_handles() const override { return ready_handles_; }
  const std::vector<std::string>& done_handles() const override { return done_handles_; }

  Status record_ready(uint64_t seq, void* stream) override {
    ScopedPrimaryContext context(d_, device_);
    if (!context.status().ok()) return context.status();
    // caller's stream -> announce stream -> the interprocess event: the event's latest record
    // then follows every earlier announcement too, on whatever stream it was made.
    if (Status s = d_->check(d_->event_record(local_, static_cast<CUstream>(stream)), "cuEventRecord"); !s.ok()) return s;
    if (Status s = d_->check(d_->stream_wait_event(announce_, local_, 0), "cuStreamWaitEvent"); !s.ok()) return s;
    return d_->check(d_->event_record(ready_[slot(seq)], announce_), "cuEventRecord (ready)");
  }

  Status wait_done(uint64_t seq, void* stream) override {
    ScopedPrimaryContext context(d_, device_);
    if (!context.status().ok()) return context.status();
    return d_->check(d_->stream_wait_event(static_cast<CUstream>(stream), done_[slot(seq)], 0), "cuStreamWaitEvent");
  }

  Status host_wait_done(uint64_t seq, std::chrono::steady_clock::time_point deadline, bool* done) override {
    *done = false;
    ScopedPrimaryContext context(d_, device_);
    if (!context.status().ok()) return context.status();
    for (;;) {
      const CUresult r = d_->event_query(done_[slot(seq)]);
      if (r == CUDA_SUCCESS) {
        *done = true;
        return Status();
      }
      if (r != CUDA_ERROR_NOT_READY) return d_->check(r, "cuEventQuery (done)");
      if (std::chrono::steady_clock::now() >= deadline) return Status();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 private:
  static uint32_t slot(uint64_t seq) { return static_cast<uint32_t>(seq % kDeviceEventsPerDirection); }

  const Driver driver_;
  const Driver* d_ = &driver_;
  CUdevice device_;
  CUstream announce_ = nullptr;
  CUevent local_ = nullptr;
  std::vector<CUevent> ready_, done_;
  std::vector<std::string> ready_handles_, done_handles_;
};

}  // namespace

Status create_cuda_device_events(const Driver* d, int ordinal, std::unique_ptr<DeviceEvents>* out) {
  CUdevice device = 0;
  if (CUresult r = d->device_get(&device, ordinal); r != CUDA_SUCCESS) {
    return Status::invalid_argument("device events: no CUDA device " + std::to_string(ordinal) + " (" + d->describe(r) +
                                    ")");
  }
  auto events = std::make_unique<CudaDeviceEvents>(*d, device);
  if (Status s = events->create(); !s.ok()) {
    return Status(s.code(), "device events on device " + std::to_string(ordinal) + ": " + s.message());
  }
  *out = std::move(events);
  return Status();
}

}  // namespace gradsync
