#include "daemon/config_file.h"

#include <fstream>
#include <sstream>
#include <toml++/toml.h>

namespace gradsync {
namespace {

std::string where(const std::string& path, const toml::source_region& source) {
  return path + ":" + std::to_string(source.begin.line);
}

// A scalar as the text its flag would take; false for kinds no flag takes.
bool scalar_text(const toml::node& node, std::string* out) {
  if (auto s = node.value<std::string>(); s && node.is_string()) {
    *out = *s;
    return true;
  }
  if (node.is_integer()) {
    // No setting takes a negative number; the flags' parser would wrap one to a huge value.
    const int64_t value = *node.value<int64_t>();
    if (value < 0) return false;
    *out = std::to_string(value);
    return true;
  }
  if (node.is_boolean()) {
    *out = *node.value<bool>() ? "true" : "false";
    return true;
  }
  return false;
}

}  // namespace

Status read_config_file(const std::string& path, std::vector<FileSetting>* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::invalid_argument("cannot read config file '" + path + "'");
  std::ostringstream text;
  text << file.rdbuf();
  toml::table table;
  try {
    table = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    return Status::invalid_argument("config file " + where(path, e.source()) + ": " + std::string(e.description()));
  }
  for (auto&& [key, node] : table) {
    FileSetting setting;
    setting.name = std::string(key.str());
    for (char& c : setting.name) {
      if (c == '_') c = '-';
    }
    setting.where = where(path, node.source());
    if (node.is_table()) {
      return Status::invalid_argument("config file " + setting.where + ": [" + setting.name +
                                      "] is a table; gradsyncd's settings are top-level keys (see gradsyncd --help)");
    }
    if (const toml::array* array = node.as_array()) {
      for (const toml::node& item : *array) {
        std::string value;
        if (!scalar_text(item, &value)) {
          return Status::invalid_argument("config file " + setting.where + ": " + setting.name +
                                          " must hold strings or non-negative integers");
        }
        setting.values.push_back(std::move(value));
      }
    } else {
      std::string value;
      if (!scalar_text(node, &value)) {
        return Status::invalid_argument("config file " + setting.where + ": " + setting.name +
                                        " must be a string, a non-negative integer or a boolean");
      }
      setting.values.push_back(std::move(value));
    }
    out->push_back(std::move(setting));
  }
  return Status();
}

}  // namespace gradsync
