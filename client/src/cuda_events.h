// DeviceEvents over the CUDA driver (cuda_driver.h).
#pragma once

#include <memory>

#include "client/src/cuda_driver.h"
#include "client/src/device_memory.h"

namespace gradsync {

// Opens both rings from the daemon's handles and makes the internal announce stream, on
// `ordinal`'s primary context (retained for the events' life). `d` must be loaded; the events
// keep a copy of its entry points.
Status open_cuda_device_events(const Driver* d, int ordinal, const std::vector<std::string>& ready,
                               const std::vector<std::string>& done, std::unique_ptr<DeviceEvents>* out);

}  // namespace gradsync
