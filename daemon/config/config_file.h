// gradsyncd's configuration file: TOML (/etc/gradsync/gradsyncd.toml), read with toml++. Its
// keys are the flags' names ("timeout-ms = 30000", "allow-uid = [1000, 1001]"; an underscore
// may stand for a dash), all at the top level. Values become the flags' text, so the file and
// the command line are checked by the same rules; flags given on the command line win.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shared/status.h"

namespace gradsync {

// One setting from the file: its flag name, its values (several for an array) and where it is.
struct FileSetting {
  std::string name;
  std::vector<std::string> values;
  std::string where;  // "FILE:LINE"
};

// Reads `path`. Errors name the file, the line and what is wrong: a TOML syntax error, a
// table (sections are not used), or a value of a kind no flag takes.
Status read_config_file(const std::string& path, std::vector<FileSetting>* out);

}  // namespace gradsync
