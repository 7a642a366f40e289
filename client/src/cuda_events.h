// DeviceEvents over the CUDA driver (cuda_driver.h).
#pragma once

#include <memory>

#include "client/src/cuda_driver.h"
#include "client/src/device_memory.h"

namespace gradsync {

// Creates both rings and the internal announce stream on `ordinal`'s primary context. `d` must
// be loaded; the events keep a copy of its entry points.
Status create_cuda_device_events(const Driver* d, int ordinal, std::unique_ptr<DeviceEvents>* out);

}  // namespace gradsync
