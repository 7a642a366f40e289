// A tensor set's layout as each node publishes it in the rendezvous store, for the others to
// compare with their own (PeerCluster::check_layout): the layout's fingerprint, the bucket cap,
// the outputs reserved, the mask, and the tensors. Text, one record per node and set:
// "<fingerprint>\n<cap> <outputs> <mask count> <mask digest>\n<dtype> <numel> <group>\n...".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/model/tensor_set.h"
#include "daemon/plan/planner.h"

namespace gradsync {

// The outputs a set reserved, as the record's bit mask.
inline constexpr int kGatherOutput = 1;
inline constexpr int kShardOutput = 2;

// A set's mask as the record states it.
struct MaskRecord {
  uint64_t count = 0;  // 0: no mask
  uint64_t digest = 0;
  bool operator==(const MaskRecord&) const = default;
};

std::string encode_layout(const TensorSet& set);

// Keeps at most `most` tensors and counts them all (*total): a store that answers a huge record
// does not make the daemon hold it decoded, and a mismatch beyond the first `most` is still
// said by the counts. False for a record no gradsyncd writes (a field missing, an unknown dtype).
bool decode_layout(const std::string& text, size_t most, uint64_t* fingerprint, uint64_t* cap, int* gather,
                   MaskRecord* mask, std::vector<plan::TensorLayout>* layout, size_t* total);

}  // namespace gradsync
