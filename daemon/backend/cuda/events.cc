#include "daemon/backend/cuda/events.h"

namespace gradsync::cuda {

Status EventRing::create(DeviceApi* api, int device, std::unique_ptr<EventRing>* out) {
  std::unique_ptr<EventRing> ring(new EventRing(api, device));
  for (uint32_t i = 0; i < kEventsPerDirection; ++i) {
    void* event = nullptr;
    IpcHandle handle{};
    if (Status status = api->create_ipc_event(device, &event, &handle); !status.ok()) {
      return Status(status.code(), "creating interprocess event " + std::to_string(i) + " of " +
                                       std::to_string(kEventsPerDirection) + " on device " + std::to_string(device) +
                                       ": " + status.message());
    }
    ring->events_.push_back(event);  // destroyed with the ring, also when a later one fails
    ring->handles_.push_back(handle);
  }
  *out = std::move(ring);
  return Status();
}

EventRing::~EventRing() {
  for (void* event : events_) (void)api_->destroy_event(device_, event);
}

Status EventRing::wait(uint64_t seq, void* stream) const { return api_->stream_wait_event(device_, stream, events_[slot(seq)]); }

Status EventRing::query(uint64_t seq, bool* done) const { return api_->query_event(device_, events_[slot(seq)], done); }

Status EventRing::record(uint64_t seq, void* stream) const { return api_->record_event(device_, events_[slot(seq)], stream); }

}  // namespace gradsync::cuda
