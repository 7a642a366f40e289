// DeviceMemory over the CUDA driver API, loaded with dlopen("libcuda.so.1") on first use.
#pragma once

#include <memory>

#include "client/src/device_memory.h"

namespace gradsync {

std::unique_ptr<DeviceMemory> make_cuda_vmm_memory();

}  // namespace gradsync
