#include "daemon/model/op_desc.h"

#include <algorithm>
#include <cmath>

namespace gradsync {
namespace {

std::string_view reduce_op_name(WireReduceOp op) {
  switch (op) {
    case WireReduceOp::kSum: return "sum";
    case WireReduceOp::kAvg: return "avg";
    case WireReduceOp::kMin: return "min";
    case WireReduceOp::kMax: return "max";
  }
  return "?";
}

}  // namespace

bool is_reduction(OpKind kind) {
  return kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
}

std::string describe(const OpDesc& desc, const TensorSet* set) {
  std::string text;
  switch (desc.kind) {
    case OpKind::kAllreduce:
    case OpKind::kReduce:
    case OpKind::kReduceScatter:
      text = desc.kind == OpKind::kAllreduce ? "allreduce(" : desc.kind == OpKind::kReduce ? "reduce(" : "reduce_scatter(";
      text += reduce_op_name(desc.reduce_op);
      if (desc.reduce_op == WireReduceOp::kAvg) {
        text += desc.scaling == WireScaling::kBefore ? ", divide before" : ", divide after";
        if (desc.divisor != 0) text += ", divisor " + std::to_string(desc.divisor);
      }
      if (desc.kind == OpKind::kReduce) text += ", root " + std::to_string(desc.root);
      if (desc.health) text += ", health";
      if (desc.wire != DType::kFloat32) text += ", " + std::string(dtype_name(desc.wire)) + " on the wire";
      text += ")";
      break;
    case OpKind::kBroadcast:
      text = "broadcast(root " + std::to_string(desc.root) + ")";
      break;
    case OpKind::kAllgather:
      text = "allgather";
      break;
  }
  return text + " on " + (set ? set->name() : set_name(desc.set_id, ""));
}

Status parse_op(const SubmitEntry& entry, int world_size, OpDesc* desc) {
  if (entry.op < static_cast<uint32_t>(OpKind::kAllreduce) || entry.op > static_cast<uint32_t>(OpKind::kReduceScatter)) {
    return Status::invalid_argument("unknown operation " + std::to_string(entry.op));
  }
  desc->kind = static_cast<OpKind>(entry.op);
  desc->set_id = entry.set_id;
  desc->narrow_accumulate = (entry.flags & kSubmitNarrowAccumulate) != 0;
  desc->health = (entry.flags & kSubmitHealth) != 0;
  if (desc->health && desc->kind != OpKind::kAllreduce) {
    return Status::invalid_argument("health is computed for allreduce only");
  }
  const bool bf16 = (entry.flags & kSubmitWireBFloat16) != 0, f16 = (entry.flags & kSubmitWireFloat16) != 0;
  if (bf16 && f16) return Status::invalid_argument("two wire dtypes at once");
  desc->wire = bf16 ? DType::kBFloat16 : f16 ? DType::kFloat16 : DType::kFloat32;
  if (desc->wire != DType::kFloat32 && !is_reduction(desc->kind)) {
    return Status::invalid_argument("wire compression applies to allreduce, reduce and reduce-scatter only");
  }
  if (is_reduction(desc->kind)) {
    if (entry.reduce_op < static_cast<uint32_t>(WireReduceOp::kSum) ||
        entry.reduce_op > static_cast<uint32_t>(WireReduceOp::kMax)) {
      return Status::invalid_argument("unknown reduce operation " + std::to_string(entry.reduce_op));
    }
    desc->reduce_op = static_cast<WireReduceOp>(entry.reduce_op);
    if (desc->reduce_op == WireReduceOp::kAvg) {
      if (entry.scaling != static_cast<uint32_t>(WireScaling::kAfter) &&
          entry.scaling != static_cast<uint32_t>(WireScaling::kBefore)) {
        return Status::invalid_argument("unknown scaling mode " + std::to_string(entry.scaling));
      }
      desc->scaling = static_cast<WireScaling>(entry.scaling);
      if (!std::isfinite(entry.divisor) || entry.divisor < 0) {
        return Status::invalid_argument("divisor must be positive and finite (0 means the group size), got " +
                                        std::to_string(entry.divisor));
      }
      desc->divisor = entry.divisor;
    } else if (entry.divisor != 0) {
      return Status::invalid_argument("a divisor applies only to avg");
    }
  }
  if (desc->kind == OpKind::kBroadcast || desc->kind == OpKind::kReduce) {
    if (entry.root < 0 || entry.root >= world_size) {
      return Status::invalid_argument("root " + std::to_string(entry.root) + " is outside world size " +
                                      std::to_string(world_size));
    }
    desc->root = entry.root;
  }
  return Status::ok_status();
}

reduce::KernelArgs kernel_args(const OpDesc& desc, DType dtype, int group_size) {
  reduce::KernelArgs args;
  args.dtype = dtype;
  args.wide_accumulate = !desc.narrow_accumulate;
  switch (desc.reduce_op) {
    case WireReduceOp::kSum: args.combine = reduce::Combine::kSum; break;
    case WireReduceOp::kMin: args.combine = reduce::Combine::kMin; break;
    case WireReduceOp::kMax: args.combine = reduce::Combine::kMax; break;
    case WireReduceOp::kAvg:
      args.combine = reduce::Combine::kSum;
      args.scale = desc.scaling == WireScaling::kBefore ? reduce::Scale::kBefore : reduce::Scale::kAfter;
      args.divisor = desc.divisor != 0 ? desc.divisor : static_cast<double>(group_size);
      break;
  }
  return args;
}

namespace {

// A half-precision tensor crosses in its own type or as float32, never as the other half type:
// bfloat16 rounds float16's largest values up past its range (65504 becomes 65536, inf in
// float16) and keeps fewer bits; float16 overflows bfloat16's values above 65504 and flushes its
// small ones (NCCL never converts either).
std::string other_half(const std::string& set, DType dtype, DType wire) {
  return "wire compression on " + set + ": its " + std::string(dtype_name(dtype)) + " tensors cannot cross nodes as " +
         std::string(dtype_name(wire)) + " (" +
         (dtype == DType::kFloat16 ? "bfloat16 rounds float16's largest values, 65504, up past its range"
                                   : "float16 overflows bfloat16's values above 65504 and flushes its smallest") +
         "); use " + std::string(dtype_name(dtype)) + ", their own type, or no wire dtype";
}

}  // namespace

Status check_op(const OpDesc& desc, const TensorSet& set, const Topology& topology) {
  if (desc.kind == OpKind::kAllgather && set.gather_output.empty()) {
    return Status::invalid_argument(set.name() + " was registered without an allgather output");
  }
  if (desc.kind == OpKind::kReduceScatter && set.shard_output.empty()) {
    return Status::invalid_argument(set.name() + " was registered without a reduce-scatter output");
  }
  if (desc.health) {
    for (const auto& tensor : set.layout) {
      if (!dtype_is_floating(tensor.dtype)) {
        return Status::invalid_argument("health on " + set.name() + ": " + std::string(dtype_name(tensor.dtype)) +
                                        " tensors have no inf or NaN; ask for it on floating-point sets only");
      }
    }
  }
  if (desc.wire != DType::kFloat32) {
    if (set.memory_kind != MemoryKind::kHostMemfd && desc.kind == OpKind::kReduceScatter) {
      return Status::not_supported("wire compression on " + set.name() +
                                   ": a reduce-scatter of device memory is not compressed yet (allreduce and reduce are)");
    }
    // Every bucket of these dtypes is carried in float32 (reduce::accumulation_dtype), which is
    // what the wire narrows: a half-precision set then crosses nodes at its own size.
    for (const auto& tensor : set.layout) {
      if (tensor.dtype != DType::kFloat32 && tensor.dtype != DType::kFloat16 && tensor.dtype != DType::kBFloat16) {
        return Status::invalid_argument("wire compression on " + set.name() +
                                        ": it applies to float32, float16 and bfloat16, and the set has " +
                                        std::string(dtype_name(tensor.dtype)) + " tensors");
      }
      if ((tensor.dtype == DType::kFloat16 || tensor.dtype == DType::kBFloat16) && tensor.dtype != desc.wire) {
        return Status::invalid_argument(other_half(set.name(), tensor.dtype, desc.wire));
      }
      if (tensor.dtype != DType::kFloat32 && desc.narrow_accumulate) {
        // The wire narrows float32 sums and combines in float32: a node sum already rounded to
        // the half type would be rounded twice.
        return Status::invalid_argument("wire compression on " + set.name() + ": its " +
                                        std::string(dtype_name(tensor.dtype)) +
                                        " tensors need fp32_accumulate = true (the wire narrows float32 sums)");
      }
    }
  }
  if (is_reduction(desc.kind)) {
    for (const auto& bucket : set.plan.buckets) {
      const int group_size = static_cast<int>(topology.ranks(bucket.group).size());
      const std::string_view problem = reduce::validate_kernel_args(kernel_args(desc, bucket.dtype, group_size));
      if (!problem.empty()) return Status::invalid_argument(std::string(problem));
    }
  }
  if (desc.kind == OpKind::kBroadcast || desc.kind == OpKind::kReduce) {
    for (const auto& bucket : set.plan.buckets) {
      const auto& ranks = topology.ranks(bucket.group);
      if (!std::binary_search(ranks.begin(), ranks.end(), desc.root)) {
        return Status::invalid_argument("root rank " + std::to_string(desc.root) + " is not in group '" +
                                        bucket.group + "'");
      }
    }
  }
  return Status();
}

std::string local_rank_name(const Topology& topology, uint32_t local_rank) {
  return "rank " + std::to_string(topology.rank_of(static_cast<int>(local_rank))) + " (local rank " +
         std::to_string(local_rank) + ")";
}

}  // namespace gradsync
