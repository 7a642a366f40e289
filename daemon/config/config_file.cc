#include "daemon/config/config_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <toml++/toml.h>

#include "shared/unique_fd.h"

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
  // Examined and read through one descriptor, so what was checked is what is read. gradsyncd
  // applies what the file says (who may connect, where it listens), often as root: a file
  // another user could change hands that user the daemon, so it must belong to root or to
  // gradsyncd's user and be writable by nobody else, as the token file must.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::invalid_argument("cannot read config file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Status::invalid_argument("config file '" + path + "' is not a regular file");
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return Status::invalid_argument("config file '" + path + "' belongs to uid " + std::to_string(st.st_uid) +
                                    ", not to root or gradsyncd's user (uid " + std::to_string(::geteuid()) +
                                    "): its owner could change this daemon's settings");
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::invalid_argument("config file '" + path + "' is writable by other users (mode " + mode +
                                    "): they could change this daemon's settings (chmod go-w it)");
  }
  std::string content;
  char buffer[8192];
  ssize_t got = 0;
  while ((got = ::read(fd.get(), buffer, sizeof buffer)) > 0) {
    content.append(buffer, static_cast<size_t>(got));
    if (content.size() > (1u << 20)) return Status::invalid_argument("config file '" + path + "' is over 1 MiB");
  }
  if (got < 0) return Status::invalid_argument("cannot read config file '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << content;
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
