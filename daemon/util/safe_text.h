// Text that came from a client (a job id, a group name, a rendezvous address, a whole frame's
// worth of bytes), made safe to log or to echo back: control characters and bytes that are not
// UTF-8 are shown as \xNN, and the code points that act like them (C1 controls, U+2028/2029,
// the bidirectional overrides and isolates) as \uNNNN, so a newline cannot forge a log line, an
// escape sequence cannot drive an operator's terminal, text cannot be shown reordered, and a
// reply is always valid protobuf text; and at most
// `max_bytes` are kept, saying how many were cut. Every log line and every error reply passes
// through it (log.cc, client_handler.cc), so no call site has to remember.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gradsync {

std::string safe_text(std::string_view text, size_t max_bytes);

// The length of the valid UTF-8 sequence (no overlongs, surrogates or code points past
// U+10FFFF) that starts at text[i], or 0.
size_t utf8_sequence_length(std::string_view text, size_t i);

}  // namespace gradsync
