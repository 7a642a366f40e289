// Parameter layouts of real models, for the demo, the benchmark and the tests: what a trainer
// would register for its gradients.
#pragma once

#include <string>
#include <vector>

#include "gradsync/options.h"

namespace gradsync {

// torchvision's resnet50 in registration order: 161 float32 tensors, 25,557,032 parameters.
std::vector<TensorSpec> resnet50_layout();

// A small mixed layout for quick runs: float32 convolutions and norms, 12 tensors.
std::vector<TensorSpec> tiny_layout();

// By name ("resnet50", "tiny"); throws Error naming the known models otherwise.
std::vector<TensorSpec> model_layout(const std::string& name);

}  // namespace gradsync
