// Whether a user belongs to a group, by the system's user and group databases (NSS): the
// group's primary members and its member list, as `id -G` reports them. Used for the admin
// group (--admin-group); read at each call, so membership changes need no restart.
#pragma once

#include <sys/types.h>

#include <string>

namespace gradsync::admin {

// False when the user or the group does not exist.
bool user_in_group(uid_t uid, const std::string& group);

}  // namespace gradsync::admin
