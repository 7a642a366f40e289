#include "daemon/admin/group_membership.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace gradsync::admin {

bool user_in_group(uid_t uid, const std::string& group) {
  if (group.empty()) return false;
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(static_cast<size_t>(size > 0 ? size : 16384));
  passwd pw{};
  passwd* user = nullptr;
  if (::getpwuid_r(uid, &pw, buffer.data(), buffer.size(), &user) != 0 || !user) return false;
  const std::string name = user->pw_name;
  const gid_t primary = user->pw_gid;

  size = ::sysconf(_SC_GETGR_R_SIZE_MAX);
  std::vector<char> group_buffer(static_cast<size_t>(size > 0 ? size : 16384));
  struct group gr {};
  struct group* found = nullptr;
  // A large group's member list may not fit: grow the buffer as getgrnam_r asks.
  int error = 0;
  while ((error = ::getgrnam_r(group.c_str(), &gr, group_buffer.data(), group_buffer.size(), &found)) == ERANGE &&
         group_buffer.size() < (1u << 24)) {
    group_buffer.resize(group_buffer.size() * 2);
  }
  if (error != 0 || !found) return false;
  const gid_t wanted = found->gr_gid;

  int count = 64;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  while (::getgrouplist(name.c_str(), primary, groups.data(), &count) < 0) {
    if (count > 65536) return false;
    groups.resize(static_cast<size_t>(count));
  }
  groups.resize(static_cast<size_t>(count));
  return std::find(groups.begin(), groups.end(), wanted) != groups.end();
}

}  // namespace gradsync::admin
