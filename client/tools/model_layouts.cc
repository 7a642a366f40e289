#include "client/tools/model_layouts.h"

#include "shared/status.h"

namespace gradsync {
namespace {

TensorSpec f32(uint64_t numel) { return TensorSpec{DType::kFloat32, numel, "dp"}; }

}  // namespace

std::vector<TensorSpec> resnet50_layout() {
  // Conv weights (no bias), each followed by its batch norm's weight and bias; a stage's first
  // block adds the downsample conv and norm after conv3; then fc weight and bias.
  std::vector<TensorSpec> tensors;
  auto conv = [&](uint64_t in, uint64_t out, uint64_t kernel) { tensors.push_back(f32(in * out * kernel * kernel)); };
  auto batch_norm = [&](uint64_t channels) {
    tensors.push_back(f32(channels));
    tensors.push_back(f32(channels));
  };
  conv(3, 64, 7);
  batch_norm(64);
  uint64_t in = 64;
  const uint64_t stage_planes[] = {64, 128, 256, 512};
  const int stage_blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const uint64_t planes = stage_planes[stage];
    for (int block = 0; block < stage_blocks[stage]; ++block) {
      conv(in, planes, 1);
      batch_norm(planes);
      conv(planes, planes, 3);
      batch_norm(planes);
      conv(planes, planes * 4, 1);
      batch_norm(planes * 4);
      if (block == 0) {
        conv(in, planes * 4, 1);
        batch_norm(planes * 4);
      }
      in = planes * 4;
    }
  }
  tensors.push_back(f32(2048 * 1000));
  tensors.push_back(f32(1000));
  return tensors;
}

std::vector<TensorSpec> tiny_layout() {
  std::vector<TensorSpec> tensors;
  const uint64_t channels[] = {16, 32, 64};
  uint64_t in = 3;
  for (uint64_t out : channels) {
    tensors.push_back(f32(in * out * 9));
    tensors.push_back(f32(out));
    tensors.push_back(f32(out));
    in = out;
  }
  tensors.push_back(f32(64 * 10));
  tensors.push_back(f32(10));
  tensors.push_back(f32(1));
  return tensors;
}

std::vector<TensorSpec> model_layout(const std::string& name) {
  if (name == "resnet50") return resnet50_layout();
  if (name == "tiny") return tiny_layout();
  throw Error(Status::invalid_argument("unknown model '" + name + "'; known models: resnet50, tiny"));
}

}  // namespace gradsync
