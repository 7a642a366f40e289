#include "daemon/job/op.h"

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

std::string describe(const OpDesc& desc, const TensorSet* set) {
  std::string text;
  switch (desc.kind) {
    case OpKind::kAllreduce:
    case OpKind::kReduce:
      text = desc.kind == OpKind::kAllreduce ? "allreduce(" : "reduce(";
      text += reduce_op_name(desc.reduce_op);
      if (desc.reduce_op == WireReduceOp::kAvg) {
        text += desc.scaling == WireScaling::kBefore ? ", divide before" : ", divide after";
        if (desc.divisor != 0) text += ", divisor " + std::to_string(desc.divisor);
      }
      if (desc.kind == OpKind::kReduce) text += ", root " + std::to_string(desc.root);
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
  if (entry.op < static_cast<uint32_t>(OpKind::kAllreduce) || entry.op > static_cast<uint32_t>(OpKind::kReduce)) {
    return Status::invalid_argument("unknown operation " + std::to_string(entry.op));
  }
  desc->kind = static_cast<OpKind>(entry.op);
  desc->set_id = entry.set_id;
  desc->narrow_accumulate = (entry.flags & kSubmitNarrowAccumulate) != 0;
  if (desc->kind == OpKind::kAllreduce || desc->kind == OpKind::kReduce) {
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

}  // namespace gradsync
