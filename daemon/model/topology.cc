#include "daemon/model/topology.h"

#include <algorithm>
#include <set>

namespace gradsync {
namespace {

// Group names go into the whitespace-separated layout text (cluster.cc) and into peer-store
// keys ("group/<name>/"), so they are limited to characters neither uses as separators.
constexpr size_t kMaxGroupNameLength = 64;
constexpr const char* kGroupNameRule = "1 to 64 characters, each one of letters, digits, '-', '_' and '.'";

bool valid_group_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxGroupNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

}  // namespace

std::vector<int> Topology::local_members(const std::string& group) const {
  std::vector<int> members;
  for (int rank : ranks(group)) {
    if (rank / local_world_size == node) members.push_back(rank % local_world_size);
  }
  return members;
}

std::vector<int> Topology::nodes_of(const std::string& group) const {
  std::set<int> found;
  for (int rank : ranks(group)) found.insert(rank / local_world_size);
  return {found.begin(), found.end()};
}

Status make_topology(int world_size, int local_world_size, int rank, int local_rank,
                     const std::map<std::string, std::vector<int>>& declared, Topology* topology) {
  if (world_size % local_world_size != 0) {
    return Status::invalid_argument("world size " + std::to_string(world_size) +
                                    " is not a multiple of local world size " + std::to_string(local_world_size) +
                                    "; every node must run the same number of ranks");
  }
  if (rank % local_world_size != local_rank) {
    return Status::invalid_argument("rank " + std::to_string(rank) + " with local rank " + std::to_string(local_rank) +
                                    " does not fit node-major numbering (rank = node * " +
                                    std::to_string(local_world_size) + " + local rank)");
  }
  Topology t;
  t.world_size = world_size;
  t.local_world_size = local_world_size;
  t.node = rank / local_world_size;
  t.nodes = world_size / local_world_size;
  for (const auto& [name, ranks] : declared) {
    if (name == kDefaultGroup) return Status::invalid_argument("group name 'dp' is reserved for all ranks");
    if (!valid_group_name(name)) {
      return Status::invalid_argument("group name '" + name + "' is refused: a group name has " + kGroupNameRule);
    }
    if (ranks.empty()) return Status::invalid_argument("group '" + name + "' has no ranks");
    std::vector<int> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] < 0 || sorted[i] >= world_size) {
        return Status::invalid_argument("group '" + name + "' names rank " + std::to_string(sorted[i]) +
                                        ", outside world size " + std::to_string(world_size));
      }
      if (i > 0 && sorted[i] == sorted[i - 1]) {
        return Status::invalid_argument("group '" + name + "' names rank " + std::to_string(sorted[i]) + " twice");
      }
    }
    t.groups[name] = std::move(sorted);
  }
  std::vector<int> all(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) all[static_cast<size_t>(r)] = r;
  t.groups[kDefaultGroup] = std::move(all);
  *topology = std::move(t);
  return Status();
}

}  // namespace gradsync
