#include "tests/integration/values.h"

#include <algorithm>

namespace gradsync::test {
namespace {

template <class T>
T load(const std::vector<std::byte>& bytes) {
  T value;
  std::memcpy(&value, bytes.data(), sizeof(T));
  return value;
}

template <class T>
std::vector<std::byte> bytes_of(T value) {
  std::vector<std::byte> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

template <class T>
T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    default: return a + b;
  }
}

// Floating types: Acc is the accumulation type, round() maps back to the storage type.
template <class Acc, class ToAcc, class Round>
std::vector<std::byte> reduce_floating(const ReduceOptions& o, int world, ToAcc to_acc, Round round,
                                       bool round_every_step, std::vector<std::vector<std::byte>> inputs) {
  const Acc divisor = static_cast<Acc>(o.divisor != 0 ? o.divisor : world);
  const bool before = o.op == ReduceOp::kAvg && o.scaling == Scaling::kBefore;
  const bool after = o.op == ReduceOp::kAvg && o.scaling == Scaling::kAfter;
  auto step = [&](Acc v) { return round_every_step ? to_acc(round(v)) : v; };
  Acc acc = to_acc(inputs[0]);
  if (before) acc = step(acc / divisor);
  for (int r = 1; r < world; ++r) {
    Acc x = to_acc(inputs[static_cast<size_t>(r)]);
    if (before) x = step(x / divisor);
    acc = step(combine(o.op, acc, x));
  }
  if (after) acc = step(acc / divisor);
  return round(acc);
}

}  // namespace

std::vector<std::byte> expected_reduction(DType dtype, const ReduceOptions& o, int world, uint64_t tensor, uint64_t i,
                                          int seed) {
  std::vector<std::vector<std::byte>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(input_bytes(dtype, r, tensor, i, seed));
  switch (dtype) {
    case DType::kFloat32:
      return reduce_floating<float>(
          o, world, [](const std::vector<std::byte>& b) { return load<float>(b); },
          [](float v) { return bytes_of(v); }, false, inputs);
    case DType::kFloat64:
      return reduce_floating<double>(
          o, world, [](const std::vector<std::byte>& b) { return load<double>(b); },
          [](double v) { return bytes_of(v); }, false, inputs);
    case DType::kFloat16:
      return reduce_floating<float>(
          o, world, [](const std::vector<std::byte>& b) { return half_to_float(load<uint16_t>(b)); },
          [](float v) { return bytes_of(float_to_half(v)); }, !o.fp32_accumulate, inputs);
    case DType::kBFloat16:
      return reduce_floating<float>(
          o, world, [](const std::vector<std::byte>& b) { return bfloat16_to_float(load<uint16_t>(b)); },
          [](float v) { return bytes_of(float_to_bfloat16(v)); }, !o.fp32_accumulate, inputs);
    case DType::kInt32: {
      uint32_t acc = load<uint32_t>(inputs[0]);
      for (int r = 1; r < world; ++r) {
        const uint32_t x = load<uint32_t>(inputs[static_cast<size_t>(r)]);
        if (o.op == ReduceOp::kSum) acc += x;
        else acc = static_cast<uint32_t>(combine(o.op, static_cast<int32_t>(acc), static_cast<int32_t>(x)));
      }
      return bytes_of(acc);
    }
    case DType::kInt64: {
      uint64_t acc = load<uint64_t>(inputs[0]);
      for (int r = 1; r < world; ++r) {
        const uint64_t x = load<uint64_t>(inputs[static_cast<size_t>(r)]);
        if (o.op == ReduceOp::kSum) acc += x;
        else acc = static_cast<uint64_t>(combine(o.op, static_cast<int64_t>(acc), static_cast<int64_t>(x)));
      }
      return bytes_of(acc);
    }
    case DType::kUInt8: {
      uint8_t acc = load<uint8_t>(inputs[0]);
      for (int r = 1; r < world; ++r) {
        const uint8_t x = load<uint8_t>(inputs[static_cast<size_t>(r)]);
        acc = o.op == ReduceOp::kSum ? static_cast<uint8_t>(acc + x) : combine(o.op, acc, x);
      }
      return bytes_of(acc);
    }
  }
  return {};
}

}  // namespace gradsync::test
