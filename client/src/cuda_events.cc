#include "client/src/cuda_events.h"

#include <cstring>

#include "shared/backoff.h"
#include "shared/channel_layout.h"

namespace gradsync {
namespace {

class CudaDeviceEvents final : public DeviceEvents {
 public:
  // The driver's entry points are copied: a Work may keep these events after its Client is gone.
  CudaDeviceEvents(const Driver& d, CUdevice device) : driver_(d), device_(device) {}

  ~CudaDeviceEvents() override {
    if (!context_) return;
    Pushed pushed(this);
    // The announce stream's records must be done before the events go: the daemon may still
    // wait on them. (The daemon made the events and owns them; closing our openings does not
    // end them for it.)
    if (announce_) {
      d_->stream_synchronize(announce_);
      d_->stream_destroy(announce_);
    }
    for (CUevent e : ready_) d_->event_destroy(e);
    for (CUevent e : done_) d_->event_destroy(e);
    if (local_) d_->event_destroy(local_);
    pushed.release();
    d_->primary_ctx_release(device_);
  }

  Status open(const std::vector<std::string>& ready, const std::vector<std::string>& done) {
    if (ready.size() != kDeviceEventsPerDirection || done.size() != kDeviceEventsPerDirection) {
      return Status::protocol("the daemon sent " + std::to_string(ready.size()) + " ready and " +
                              std::to_string(done.size()) + " done event handles for a device set, not " +
                              std::to_string(kDeviceEventsPerDirection) + " each");
    }
    if (Status s = d_->check(d_->primary_ctx_retain(&context_, device_), "cuDevicePrimaryCtxRetain"); !s.ok()) {
      context_ = nullptr;
      return s;
    }
    Pushed pushed(this);
    if (!pushed.status.ok()) return pushed.status;
    if (Status s = d_->check(d_->stream_create(&announce_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); !s.ok()) return s;
    if (Status s = d_->check(d_->event_create(&local_, CU_EVENT_DISABLE_TIMING), "cuEventCreate"); !s.ok()) return s;
    for (auto [handles, ring] : {std::pair{&ready, &ready_}, std::pair{&done, &done_}}) {
      for (const std::string& bytes : *handles) {
        CUipcEventHandle handle{};
        if (bytes.size() != sizeof(handle.reserved)) {
          return Status::protocol("an event handle from the daemon has " + std::to_string(bytes.size()) + " bytes");
        }
        std::memcpy(handle.reserved, bytes.data(), sizeof(handle.reserved));
        CUevent event = nullptr;
        if (Status s = d_->check(d_->ipc_open_event_handle(&event, handle), "cuIpcOpenEventHandle"); !s.ok()) return s;
        ring->push_back(event);
      }
    }
    return Status();
  }

  Status record_ready(uint64_t seq, void* stream) override {
    Pushed pushed(this);
    if (!pushed.status.ok()) return pushed.status;
    const auto user = static_cast<CUstream>(stream);
    // A record made while the stream is captured into a CUDA graph would become a graph node,
    // and the daemon would read before the tensors are written.
    CUstreamCaptureStatus capturing = CU_STREAM_CAPTURE_STATUS_NONE;
    if (Status s = d_->check(d_->stream_is_capturing(user, &capturing), "cuStreamIsCapturing"); !s.ok()) return s;
    if (capturing != CU_STREAM_CAPTURE_STATUS_NONE) {
      return Status::invalid_argument("device tensors cannot be announced ready from a stream that is being captured "
                                      "into a CUDA graph");
    }
    // caller's stream -> announce stream -> the interprocess event: the event's latest record
    // then follows every earlier announcement too, on whatever stream it was made.
    if (Status s = d_->check(d_->event_record(local_, user), "cuEventRecord"); !s.ok()) return s;
    if (Status s = d_->check(d_->stream_wait_event(announce_, local_, 0), "cuStreamWaitEvent"); !s.ok()) return s;
    return d_->check(d_->event_record(ready_[slot(seq)], announce_), "cuEventRecord (ready)");
  }

  Status wait_done(uint64_t seq, void* stream) override {
    Pushed pushed(this);
    if (!pushed.status.ok()) return pushed.status;
    return d_->check(d_->stream_wait_event(static_cast<CUstream>(stream), done_[slot(seq)], 0), "cuStreamWaitEvent");
  }

  Status host_wait_done(uint64_t seq, std::chrono::steady_clock::time_point deadline, bool* done) override {
    *done = false;
    Pushed pushed(this);
    if (!pushed.status.ok()) return pushed.status;
    // Spin, then yield, then sleep (with 1 us timer slack for the wait, the trainer's thread's
    // own put back after): a small bucket is through in microseconds, and a sleep with the
    // default 50 us slack would set the round trip.
    Backoff backoff;
    for (;;) {
      const CUresult r = d_->event_query(done_[slot(seq)]);
      if (r == CUDA_SUCCESS) {
        *done = true;
        return Status();
      }
      if (r != CUDA_ERROR_NOT_READY) return d_->check(r, "cuEventQuery (done)");
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return Status();
      backoff.pause();
    }
  }

 private:
  // The retained primary context made current for a scope, the caller's put back after.
  struct Pushed {
    explicit Pushed(CudaDeviceEvents* e) : e(e) {
      status = e->d_->check(e->d_->ctx_push(e->context_), "cuCtxPushCurrent");
      pushed = status.ok();
    }
    ~Pushed() { release(); }
    void release() {
      if (!pushed) return;
      CUcontext popped = nullptr;
      e->d_->ctx_pop(&popped);
      pushed = false;
    }
    CudaDeviceEvents* e;
    Status status;
    bool pushed = false;
  };

  static uint32_t slot(uint64_t seq) { return static_cast<uint32_t>(seq % kDeviceEventsPerDirection); }

  const Driver driver_;
  const Driver* d_ = &driver_;
  CUdevice device_;
  CUcontext context_ = nullptr;  // retained from open() to the destructor
  CUstream announce_ = nullptr;
  CUevent local_ = nullptr;
  std::vector<CUevent> ready_, done_;
};

}  // namespace

Status open_cuda_device_events(const Driver* d, int ordinal, const std::vector<std::string>& ready,
                               const std::vector<std::string>& done, std::unique_ptr<DeviceEvents>* out) {
  CUdevice device = 0;
  if (CUresult r = d->device_get(&device, ordinal); r != CUDA_SUCCESS) {
    return Status::invalid_argument("device events: no CUDA device " + std::to_string(ordinal) + " (" + d->describe(r) +
                                    ")");
  }
  auto events = std::make_unique<CudaDeviceEvents>(*d, device);
  if (Status s = events->open(ready, done); !s.ok()) {
    return Status(s.code(), "device events on device " + std::to_string(ordinal) + ": " + s.message());
  }
  *out = std::move(events);
  return Status();
}

}  // namespace gradsync
