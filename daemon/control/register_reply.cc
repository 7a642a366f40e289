#include "daemon/control/register_reply.h"

#include <cstdint>

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

namespace {

size_t varint_bytes(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
}

// A length-delimited field of `length` bytes, its one-byte tag included (every field number of
// these messages is below 16).
size_t field_bytes(size_t length) { return 1 + varint_bytes(length) + length; }

}  // namespace

size_t register_reply_bound(const plan::Plan& plan) {
  // Protobuf's encoding, counted rather than built (a million buckets' messages would take
  // hundreds of megabytes for a moment): BucketInfo {group, dtype, packed tensors, bytes,
  // zero_copy} each, as fill_register_buckets() makes them, with every field present.
  size_t body = 0;
  for (const plan::Bucket& bucket : plan.buckets) {
    size_t tensors = 0;
    for (uint32_t t : bucket.tensors) tensors += varint_bytes(t);
    const size_t info = field_bytes(bucket.group.size()) + 1 + varint_bytes(static_cast<uint64_t>(bucket.dtype)) +
                        (tensors > 0 ? field_bytes(tensors) : 0) + 1 + varint_bytes(bucket.bytes) + 2;
    body += field_bytes(info);
  }
  // Two rings of event handles (64 bytes each) on a device set.
  body += 2 * kDeviceEventsPerDirection * field_bytes(64);
  // Reply {id, fd_count, register}: the largest id and count.
  return (1 + 10) + (1 + 5) + field_bytes(body);
}

}  // namespace gradsync
