// How messages name a tensor set. A set's number is the protocol's (its registration order in
// the client, the same on every rank), and means nothing to a user of a layer above the C++
// API: a Python trainer never made "set 0", it made a GradBuffer or a DDP hook. So a
// registration may carry a label, given by whoever made the set ("DDP bucket 3"), and every
// message, the client's and the daemon's, names the set by it, the number in brackets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shared/status.h"

namespace gradsync {

// A label longer than this is refused at registration, naming the limit.
inline constexpr size_t kMaxSetLabelBytes = 128;

// "DDP bucket 3 (set 0)" with a label, "set 0" without.
std::string set_name(uint32_t id, std::string_view label);

// OK, or InvalidArgument naming what is wrong: more than kMaxSetLabelBytes, not UTF-8, or a
// character that would drive or reorder an operator's terminal where the label is shown
// (gradsyncctl, logs): C0 and C1 controls, DEL, U+2028/2029, the bidirectional marks,
// embeddings, overrides and isolates. Both the client library and the daemon check.
Status check_set_label(std::string_view label);

}  // namespace gradsync
