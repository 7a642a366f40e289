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

namespace gradsync {

// A label longer than this is refused at registration, naming the limit.
inline constexpr size_t kMaxSetLabelBytes = 128;

// "DDP bucket 3 (set 0)" with a label, "set 0" without.
std::string set_name(uint32_t id, std::string_view label);

}  // namespace gradsync
