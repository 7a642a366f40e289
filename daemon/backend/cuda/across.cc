#include "daemon/backend/cuda/across.h"

namespace gradsync::cuda {

std::vector<TableRequest> AcrossPlanner::tables(const AcrossBucket& bucket, int device, AcrossSteps&) const {
  const Launches l = launches(bucket, device);
  std::vector<TableRequest> out;
  if (l.gather) out.push_back(TableRequest{Side::kGather, l.only, false, l.bytes});
  if (l.scatter && l.scatter_shards) out.push_back(TableRequest{Side::kScatterShards, -1, false, false});
  if (l.scatter && !l.scatter_shards) {
    out.push_back(TableRequest{Side::kScatter, l.scatter_only, l.scatter_skips_root, l.bytes});
  }
  return out;
}

const AcrossPlanner& across_planner(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return allreduce_across();
    case OpKind::kReduce: return reduce_across();
    case OpKind::kBroadcast: return broadcast_across();
    case OpKind::kAllgather: return allgather_across();
    case OpKind::kReduceScatter: return reduce_scatter_across();
  }
  return allreduce_across();  // parse_op admits no other kind
}

}  // namespace gradsync::cuda
