#include "daemon/job/join_validation.h"

#include <cctype>
#include <map>
#include <vector>

namespace gradsync {

Status validate_join(const control::JoinRequest& r, std::chrono::milliseconds default_timeout,
                     std::chrono::milliseconds max_timeout, JobParams* params) {
  const std::string& id = r.job_id();
  if (id.empty() || id.size() > 128) return Status::invalid_argument("job id must have 1 to 128 characters");
  for (char c : id) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (!ok) return Status::invalid_argument("job id '" + id + "' may contain only letters, digits, '-', '_' and '.'");
  }
  // Bounded so that a single join cannot make the daemon allocate per-rank tables without limit.
  constexpr int kMaxWorldSize = 1 << 16;
  if (r.world_size() < 1 || r.world_size() > kMaxWorldSize) {
    return Status::invalid_argument("world size must be between 1 and " + std::to_string(kMaxWorldSize) + ", got " +
                                    std::to_string(r.world_size()));
  }
  if (r.groups_size() > 1024) return Status::invalid_argument("at most 1024 process groups may be declared");
  if (r.local_world_size() < 1 || r.local_world_size() > 1024) {
    return Status::invalid_argument("local world size must be between 1 and 1024, got " +
                                    std::to_string(r.local_world_size()));
  }
  if (r.rank() < 0 || r.rank() >= r.world_size()) {
    return Status::invalid_argument("rank " + std::to_string(r.rank()) + " is outside world size " +
                                    std::to_string(r.world_size()));
  }
  if (r.local_rank() < 0 || r.local_rank() >= r.local_world_size()) {
    return Status::invalid_argument("local rank " + std::to_string(r.local_rank()) + " is outside local world size " +
                                    std::to_string(r.local_world_size()));
  }
  if (std::chrono::milliseconds(r.timeout_ms()) > max_timeout) {
    return Status::invalid_argument("timeout " + std::to_string(r.timeout_ms()) + " ms exceeds the daemon's maximum of " +
                                    std::to_string(max_timeout.count()) + " ms");
  }
  std::map<std::string, std::vector<int>> groups;
  for (const auto& group : r.groups()) {
    if (groups.count(group.name())) return Status::invalid_argument("group '" + group.name() + "' is declared twice");
    groups[group.name()] = std::vector<int>(group.ranks().begin(), group.ranks().end());
  }
  JobParams p;
  if (Status status = make_topology(r.world_size(), r.local_world_size(), r.rank(), r.local_rank(), groups, &p.topology);
      !status.ok()) {
    return status;
  }
  if (p.topology.nodes > 1 && r.rendezvous().empty()) {
    return Status::invalid_argument("a job spanning " + std::to_string(p.topology.nodes) +
                                    " nodes needs a rendezvous address (the node-0 daemon's peer address; "
                                    "clients derive it from MASTER_ADDR)");
  }
  p.id = r.job_id();
  p.world_size = r.world_size();
  p.local_world_size = r.local_world_size();
  p.timeout = r.timeout_ms() ? std::chrono::milliseconds(r.timeout_ms()) : default_timeout;
  p.rendezvous = p.topology.nodes > 1 ? r.rendezvous() : std::string();
  *params = std::move(p);
  return Status::ok_status();
}

}  // namespace gradsync
