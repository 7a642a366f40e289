// What the CUDA driver offers this daemon: asked once at start, so that a machine without a GPU
// or driver is reported once and host jobs are served regardless.
#pragma once

#include <string>

#include "shared/status.h"

namespace gradsync::cuda {

// Ok with a one-line summary ("1 device: NVIDIA H200, sm_90, 139.8 GiB") and the number of
// devices when the driver works and sees at least one; otherwise the driver's reason.
Status probe_devices(std::string* summary, int* count);

}  // namespace gradsync::cuda
