#include "daemon/job/node_record.h"

#include <algorithm>
#include <charconv>
#include <vector>

#include "shared/version.h"

namespace gradsync {
namespace {

constexpr size_t kMaxAddressBytes = 300;  // a 253-byte host name, a colon, a port; IPv6 brackets
constexpr size_t kMaxVersionBytes = 32;

std::vector<std::string_view> fields_of(std::string_view text) {
  std::vector<std::string_view> fields;
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = std::min(text.find(' ', i), text.size());
    fields.push_back(text.substr(i, end - i));
    i = end + 1;
  }
  if (!text.empty() && text.back() == ' ') fields.push_back({});  // a trailing space: malformed
  return fields;
}

// Decimal digits only (no sign, no spaces), within T.
template <typename T>
bool parse_decimal(std::string_view text, T* out) {
  if (text.empty() || text.size() > 10) return false;
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return error == std::errc() && end == text.data() + text.size();
}

bool printable(std::string_view text, size_t max_bytes) {
  return !text.empty() && text.size() <= max_bytes &&
         std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

bool version_text(std::string_view text) {
  return !text.empty() && text.size() <= kMaxVersionBytes && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '+' ||
           c == '-';
  });
}

}  // namespace

NodeRecord NodeRecord::mine(int local_world_size, std::string address) {
  return NodeRecord{local_world_size, std::move(address), kCrossNodeProtocol, kGradsyncVersion};
}

std::string NodeRecord::encode() const {
  return std::to_string(local_world_size) + " " + address + " " + std::to_string(protocol) + " " + version;
}

std::optional<NodeRecord> NodeRecord::parse(std::string_view text) {
  const std::vector<std::string_view> fields = fields_of(text);
  NodeRecord record;
  if (fields.size() >= 4) {
    // The protocol first: a node of another protocol may mean something else by the rest, and
    // may have more fields; all it must state is its protocol and version (node_record.h).
    if (!parse_decimal(fields[2], &record.protocol) || record.protocol == 0) return std::nullopt;
    if (!version_text(fields[3])) return std::nullopt;
    record.version = fields[3];
    if (record.protocol != kCrossNodeProtocol) {
      record.address = printable(fields[1], kMaxAddressBytes) ? std::string(fields[1]) : "(unreadable)";
      return record;
    }
    if (fields.size() != 4) return std::nullopt;
  } else if (fields.size() != 2) {
    return std::nullopt;  // before 0.2.1: exactly two fields, and the protocol is not stated
  }
  if (!parse_decimal(fields[0], &record.local_world_size) || record.local_world_size < 1) return std::nullopt;
  if (!printable(fields[1], kMaxAddressBytes)) return std::nullopt;
  record.address = fields[1];
  return record;
}

std::string NodeRecord::describe_version() const {
  if (protocol == 0) return "a gradsyncd older than 0.2.1 (cross-node protocol not stated)";
  return "gradsyncd " + version + " (cross-node protocol " + std::to_string(protocol) + ")";
}

}  // namespace gradsync
