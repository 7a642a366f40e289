// Where a job's ranks live: ranks are node-major (rank = node * local_world_size + local_rank),
// and process groups are named lists of global ranks. "dp" always means every rank.
// Immutable once the job is formed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "shared/status.h"

namespace gradsync {

inline constexpr const char* kDefaultGroup = "dp";

struct Topology {
  int world_size = 1;
  int local_world_size = 1;
  int node = 0;   // this node's index
  int nodes = 1;  // world_size / local_world_size
  std::map<std::string, std::vector<int>> groups;  // sorted ranks; includes "dp"

  int rank_of(int local_rank) const { return node * local_world_size + local_rank; }
  bool has_group(const std::string& name) const { return groups.count(name) != 0; }
  const std::vector<int>& ranks(const std::string& group) const { return groups.at(group); }
  // Local ranks of this node that belong to `group`, ascending.
  std::vector<int> local_members(const std::string& group) const;
  // Nodes hosting at least one rank of `group`, ascending.
  std::vector<int> nodes_of(const std::string& group) const;
};

// Builds the topology for a join: checks the node layout and the declared groups, and adds
// "dp". A group name has 1 to 64 characters, each a letter, digit, '-', '_' or '.'. The error
// names what is wrong.
Status make_topology(int world_size, int local_world_size, int rank, int local_rank,
                     const std::map<std::string, std::vector<int>>& declared, Topology* topology);

}  // namespace gradsync
