// Plain-text tables for gradsyncctl: columns padded to their widest cell.
#pragma once

#include <string>
#include <vector>

namespace gradsync::ctl {

class Table {
 public:
  explicit Table(std::vector<std::string> header);
  // Control characters in cells are shown as '?': the text comes from clients and jobs.
  void add(std::vector<std::string> row);
  std::string render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// "1.5 GiB", "12 KiB", "300 B"
std::string human_bytes(uint64_t bytes);
// "3.2 s", "45 ms", "2 h 5 min"
std::string human_ms(uint64_t ms);

}  // namespace gradsync::ctl
