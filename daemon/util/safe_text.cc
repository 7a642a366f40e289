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

namespace {

// The code point of the valid sequence of `length` bytes at text[i].
uint32_t code_point(std::string_view text, size_t i, size_t length) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  uint32_t code = byte(i) & (length == 2 ? 0x1f : length == 3 ? 0x0f : 0x07);
  for (size_t k = 1; k < length; ++k) code = (code << 6) | (byte(i + k) & 0x3f);
  return code;
}

// Valid UTF-8 that still acts on a terminal or a reader: the C1 controls (U+0085 is a line
// break to some tools, U+009B a CSI that starts an escape sequence), the line and paragraph
// separators U+2028/2029, and the bidirectional embeddings, overrides and isolates
// (U+202A-202E, U+2066-2069) that reorder what a reader sees ("Trojan Source").
bool acts(uint32_t code) {
  return (code >= 0x80 && code <= 0x9f) || code == 0x2028 || code == 0x2029 || (code >= 0x202a && code <= 0x202e) ||
         (code >= 0x2066 && code <= 0x2069);
}

}  // namespace

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
      if (const uint32_t code = code_point(text, i, length); acts(code)) {
        char escaped[12];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(code));
        out += escaped;
      } else {
        out.append(text.substr(i, length));
      }
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
