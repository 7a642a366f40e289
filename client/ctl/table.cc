#include "client/ctl/table.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace gradsync::ctl {

namespace {

// A cell as it may reach a terminal: control characters (escape sequences a client name, a
// group or an error text could carry) become '?'.
std::string printable(const std::string& cell) {
  std::string out = cell;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

}  // namespace

Table::Table(std::vector<std::string> header) { add(std::move(header)); }

void Table::add(std::vector<std::string> row) {
  for (auto& cell : row) cell = printable(cell);
  rows_.push_back(std::move(row));
}

std::string Table::render() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string human_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return text;
}

std::string human_ms(uint64_t ms) {
  char text[48];
  if (ms < 1000) {
    std::snprintf(text, sizeof text, "%llu ms", static_cast<unsigned long long>(ms));
  } else if (ms < 120'000) {
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms) / 1000);
  } else if (ms < 7'200'000) {
    std::snprintf(text, sizeof text, "%llu min", static_cast<unsigned long long>(ms / 60'000));
  } else {
    std::snprintf(text, sizeof text, "%llu h %llu min", static_cast<unsigned long long>(ms / 3'600'000),
                  static_cast<unsigned long long>(ms / 60'000 % 60));
  }
  return text;
}

}  // namespace gradsync::ctl
