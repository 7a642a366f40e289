#include "daemon/job/layout_record.h"

#include <sstream>

#include "daemon/plan/layout.h"
#include "shared/dtype.h"

namespace gradsync {

std::string encode_layout(const TensorSet& set) {
  const int outputs = (set.gather_output.empty() ? 0 : kGatherOutput) | (set.shard_output.empty() ? 0 : kShardOutput);
  std::ostringstream out;
  out << plan::fingerprint(set.layout) << "\n" << set.bucket_cap << " " << outputs << " "
      << (set.mask ? set.mask->size() : 0) << " " << set.mask_digest << "\n";
  for (const auto& t : set.layout) out << static_cast<uint32_t>(t.dtype) << " " << t.numel << " " << t.group << "\n";
  return out.str();
}

bool decode_layout(const std::string& text, size_t most, uint64_t* fingerprint, uint64_t* cap, int* gather,
                   MaskRecord* mask, std::vector<plan::TensorLayout>* layout, size_t* total) {
  std::istringstream in(text);
  if (!(in >> *fingerprint >> *cap >> *gather >> mask->count >> mask->digest)) return false;
  uint32_t dtype = 0;
  plan::TensorLayout t;
  *total = 0;
  while (in >> dtype >> t.numel >> t.group) {
    auto known = dtype_from_raw(dtype);
    if (!known) return false;
    if ((*total)++ >= most) continue;
    t.dtype = *known;
    layout->push_back(t);
  }
  return true;
}

}  // namespace gradsync
