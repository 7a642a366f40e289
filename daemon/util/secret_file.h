// Files the daemon's flags name, read once at start. A secret the operator keeps in a file (the peer cluster token, etcd's password): read
// through one descriptor, not followed through a link, so that what was checked is what is
// read, and refused unless it is a regular file that belongs to root or the daemon's user and
// that no other user can read. Errors name the flag and the file.
#pragma once

#include <string>

#include "shared/status.h"

namespace gradsync {

// The file's text without trailing whitespace; at most `max_bytes` of it.
Status read_secret_file(const std::string& path, const std::string& flag, size_t max_bytes, std::string* out);

// A file that is no secret (a certificate), read whole; the error names the flag and the file.
Status read_config_file(const std::string& path, const std::string& flag, std::string* out);

}  // namespace gradsync
