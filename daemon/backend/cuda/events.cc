#include "daemon/backend/cuda/events.h"

namespace gradsync::cuda {

Status EventRing::open(DeviceApi* api, int device, std::span<const IpcHandle> handles, std::unique_ptr<EventRing>* out) {
  if (handles.size() != kEventsPerDirection) {
    return Status::invalid_argument("an event ring needs " + std::to_string(kEventsPerDirection) + " event handles, got " +
                                    std::to_string(handles.size()));
  }
  std::unique_ptr<EventRing> ring(new EventRing(api, device));
  for (size_t i = 0; i < handles.size(); ++i) {
    void* event = nullptr;
    if (Status status = api->open_ipc_event(device, handles[i], &event); !status.ok()) {
      return Status(status.code(), "opening interprocess event " + std::to_string(i) + " of " +
                                       std::to_string(handles.size()) + " on device " + std::to_string(device) + ": " +
                                       status.message());
    }
    ring->events_.push_back(event);  // destroyed with the ring, also when a later one fails
  }
  *out = std::move(ring);
  return Status();
}

EventRing::~EventRing() {
  for (void* event : events_) (void)api_->destroy_event(device_, event);
}

Status EventRing::wait(uint64_t seq, void* stream) const { return api_->stream_wait_event(stream, events_[slot(seq)]); }

Status EventRing::record(uint64_t seq, void* stream) const { return api_->record_event(events_[slot(seq)], stream); }

}  // namespace gradsync::cuda
