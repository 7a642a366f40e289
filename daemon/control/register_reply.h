// What a RegisterReply tells the client of how its set was cut into buckets, and whether that
// reply fits in one control frame. The reply grows with the buckets (each names its tensors),
// so a registration that fits in its request's frame can still plan a reply that does not: a
// million one-tensor buckets. Such a set is refused before it is committed, naming the sizes,
// instead of committing it and then failing to answer.
#pragma once

#include <cstddef>
#include <functional>

#include "daemon/plan/planner.h"
#include "proto/control.pb.h"

namespace gradsync {

// Adds one BucketInfo per bucket of `plan`; `zero_copy(b)` says whether bucket b is reduced in
// place (one contiguous run of memory).
void fill_register_buckets(const plan::Plan& plan, const std::function<bool(size_t)>& zero_copy,
                           control::RegisterReply* body);

// The encoded size of a whole Reply frame's payload answering a registration planned as `plan`,
// at most: every bucket counted as zero-copy, the largest request id, and a device set's
// event handles.
size_t register_reply_bound(const plan::Plan& plan);

}  // namespace gradsync
