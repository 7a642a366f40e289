#include "daemon/control/register_reply.h"

#include <cstdint>
#include <limits>

#include "shared/channel_layout.h"

namespace gradsync {

void fill_register_buckets(const plan::Plan& plan, const std::function<bool(size_t)>& zero_copy,
                           control::RegisterReply* body) {
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const plan::Bucket& bucket = plan.buckets[b];
    auto* info = body->add_buckets();
    info->set_group(bucket.group);
    info->set_dtype(static_cast<control::DType>(bucket.dtype));
    for (uint32_t t : bucket.tensors) info->add_tensors(t);
    info->set_bytes(bucket.bytes);
    info->set_zero_copy(zero_copy(b));
  }
}

size_t register_reply_bound(const plan::Plan& plan) {
  control::Reply reply;
  reply.set_id(std::numeric_limits<uint64_t>::max());
  reply.set_fd_count(std::numeric_limits<uint32_t>::max());
  fill_register_buckets(plan, [](size_t) { return true; }, reply.mutable_register_());
  // Two rings of event handles (64 bytes each) on a device set, with their tags and lengths.
  const size_t events = 2 * kDeviceEventsPerDirection * (64 + 3);
  return reply.ByteSizeLong() + events;
}

}  // namespace gradsync
