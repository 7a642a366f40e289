#include "shared/set_name.h"

#include <cstdio>

namespace gradsync {
namespace {

// The code point of the UTF-8 sequence at text[i] and its length, or length 0 when it is not
// one (truncated, overlong, a surrogate, past U+10FFFF).
struct Decoded {
  uint32_t code_point = 0;
  size_t length = 0;
};

Decoded decode_utf8(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return {lead, 1};
  size_t length = 0;
  uint32_t code_point = 0;
  uint32_t smallest = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code_point = lead & 0x1F, smallest = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code_point = lead & 0x0F, smallest = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code_point = lead & 0x07, smallest = 0x10000;
  } else {
    return {};
  }
  if (i + length > text.size()) return {};
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {};
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  if (code_point < smallest || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return {};
  return {code_point, length};
}

bool drives_a_terminal(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0x200E || c == 0x200F ||
         (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || c == 0x061C;
}

}  // namespace

std::string set_name(uint32_t id, std::string_view label) {
  const std::string number = "set " + std::to_string(id);
  if (label.empty()) return number;
  return std::string(label) + " (" + number + ")";
}

Status check_set_label(std::string_view label) {
  if (label.size() > kMaxSetLabelBytes) {
    return Status::invalid_argument("a tensor set's label is at most " + std::to_string(kMaxSetLabelBytes) +
                                    " bytes; this one has " + std::to_string(label.size()));
  }
  for (size_t i = 0; i < label.size();) {
    const Decoded d = decode_utf8(label, i);
    if (d.length == 0) {
      return Status::invalid_argument("a tensor set's label must be UTF-8; byte " + std::to_string(i) +
                                      " of this one is not");
    }
    if (drives_a_terminal(d.code_point)) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "U+%04X", d.code_point);
      return Status::invalid_argument("a tensor set's label may not hold control or bidirectional characters; byte " +
                                      std::to_string(i) + " of this one is " + hex);
    }
    i += d.length;
  }
  return Status::ok_status();
}

}  // namespace gradsync
