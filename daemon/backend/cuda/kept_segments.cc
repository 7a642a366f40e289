#include "daemon/backend/cuda/kept_segments.h"

#include <algorithm>

namespace gradsync::cuda {

std::vector<Segment> kept_segments(const TensorSet& set, size_t bucket, const std::vector<uint32_t>& clients) {
  // The bucket's tensors by their canonical position; kept positions increase, so one pass
  // finds each one's tensor.
  std::vector<uint32_t> tensors(set.plan.buckets[bucket].tensors.begin(), set.plan.buckets[bucket].tensors.end());
  std::sort(tensors.begin(), tensors.end(),
            [&](uint32_t a, uint32_t b) { return set.offset_in_bucket[a] < set.offset_in_bucket[b]; });
  std::vector<Segment> segments;
  const std::vector<uint64_t>& kept = set.kept[bucket];
  size_t at = 0;  // index into tensors
  uint64_t last = 0;
  for (uint64_t k = 0; k < kept.size(); ++k) {
    const uint64_t position = kept[k];
    while (set.offset_in_bucket[tensors[at]] + set.layout[tensors[at]].numel <= position) ++at;
    const uint32_t t = tensors[at];
    const bool extends = !segments.empty() && position == last + 1 && position > set.offset_in_bucket[t];
    last = position;
    if (extends) {
      ++segments.back().count;
      continue;
    }
    Segment s;
    s.bucket_offset = k;
    s.count = 1;
    const uint64_t element = position - set.offset_in_bucket[t];
    for (size_t c = 0; c < clients.size(); ++c) {
      s.address[c] = set.address[clients[c]][t] + element * dtype_size(set.layout[t].dtype);
    }
    segments.push_back(s);
  }
  return segments;
}

}  // namespace gradsync::cuda
