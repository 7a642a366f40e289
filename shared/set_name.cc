#include "shared/set_name.h"

namespace gradsync {

std::string set_name(uint32_t id, std::string_view label) {
  const std::string number = "set " + std::to_string(id);
  if (label.empty()) return number;
  return std::string(label) + " (" + number + ")";
}

}  // namespace gradsync
