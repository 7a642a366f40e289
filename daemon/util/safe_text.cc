#include "daemon/util/safe_text.h"

#include <cstdint>
#include <cstdio>

namespace gradsync {

size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t length = 0;
  uint32_t code = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    length = 2, code = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    length = 3, code = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    length = 4, code = c & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3f);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  if (overlong || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return 0;
  return length;
}

std::string safe_text(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  size_t i = 0;
  while (i < text.size() && out.size() < max_bytes) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
    } else if (const size_t length = c >= 0x80 ? utf8_sequence_length(text, i) : 0; length > 0) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
      ++i;
    }
  }
  if (i < text.size()) out += " ... (" + std::to_string(text.size() - i) + " more bytes)";
  return out;
}

}  // namespace gradsync
