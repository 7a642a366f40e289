// One client's interprocess events in one direction (DESIGN.md decision 7): K events the daemon
// creates with cudaEventInterprocess | cudaEventDisableTiming when the client registers a
// device set; their handles go back in the RegisterReply and the client opens them. (The
// daemon never opens a handle a client names: that would let a client point the daemon at
// another job's events.) Operation `seq` uses event seq % K in both directions.
//   ready: the client records event seq % K on its stream, then pushes the ring entry; the
//          daemon makes its stream wait on the event only after reading that entry (a wait on
//          an event never recorded does nothing, so the order of those two steps is the
//          whole guarantee).
//   done:  the daemon records event seq % K after the bucket's last kernel; the index travels
//          in the completion entry and the client's stream waits on it.
// A client keeps at most K device operations outstanding, so a slot is never re-recorded
// before the other side has waited on its previous record.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "daemon/backend/cuda/device_api.h"
#include "daemon/model/memory.h"
#include "shared/channel_layout.h"

namespace gradsync::cuda {

inline constexpr uint32_t kEventsPerDirection = kDeviceEventsPerDirection;

class EventRing {
 public:
  // Creates the K events on `device`; on a failure the events made so far are destroyed and the
  // error names the slot.
  static Status create(DeviceApi* api, int device, std::unique_ptr<EventRing>* out);
  ~EventRing();
  EventRing(const EventRing&) = delete;
  EventRing& operator=(const EventRing&) = delete;

  static uint32_t slot(uint64_t seq) { return static_cast<uint32_t>(seq % kEventsPerDirection); }

  // Ready direction: `stream` waits for the client's record of operation `seq`.
  Status wait(uint64_t seq, void* stream) const;
  // Whether the work before the latest record of `seq`'s event is done (cudaEventQuery).
  Status query(uint64_t seq, bool* done) const;
  // Done direction: records operation `seq`'s event on `stream`.
  Status record(uint64_t seq, void* stream) const;

 private:
  EventRing(DeviceApi* api, int device) : api_(api), device_(device) {}

  DeviceApi* api_;
  int device_;
  std::vector<void*> events_;
  std::vector<IpcHandle> handles_;

 public:
  const std::vector<IpcHandle>& handles() const { return handles_; }
};

// Both rings of one client's device set: what the control plane holds for it (as ClientEvents)
// and the executor uses.
class ClientEventRings final : public ClientEvents {
 public:
  ClientEventRings(int device, std::unique_ptr<EventRing> ready, std::unique_ptr<EventRing> done)
      : device_(device), ready_(std::move(ready)), done_(std::move(done)) {
    for (const IpcHandle& h : ready_->handles()) ready_handles_.emplace_back(h.begin(), h.end());
    for (const IpcHandle& h : done_->handles()) done_handles_.emplace_back(h.begin(), h.end());
  }
  std::vector<std::string> ready_handles() const override { return ready_handles_; }
  std::vector<std::string> done_handles() const override { return done_handles_; }
  int device() const { return device_; }
  const EventRing& ready() const { return *ready_; }
  const EventRing& done() const { return *done_; }

 private:
  int device_;
  std::unique_ptr<EventRing> ready_;
  std::unique_ptr<EventRing> done_;
  std::vector<std::string> ready_handles_, done_handles_;
};

}  // namespace gradsync::cuda
