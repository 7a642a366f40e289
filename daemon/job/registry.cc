#include "daemon/job/registry.h"

namespace gradsync {

Status validate_join(const control::JoinRequest& r, std::chrono::milliseconds max_timeout) {
  const std::string& id = r.job_id();
  if (id.empty() || id.size() > 128) return Status::invalid_argument("job id must have 1 to 128 characters");
  for (char c : id) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (!ok) return Status::invalid_argument("job id '" + id + "' may contain only letters, digits, '-', '_' and '.'");
  }
  if (r.world_size() < 1) return Status::invalid_argument("world size must be at least 1, got " + std::to_string(r.world_size()));
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
  if (r.world_size() != r.local_world_size()) {
    return Status::not_supported("multi-node jobs are not supported yet: world size " + std::to_string(r.world_size()) +
                                 " spans more than this node's local world size " +
                                 std::to_string(r.local_world_size()) + "; this daemon reduces within one node");
  }
  if (r.rank() != r.local_rank()) {
    return Status::invalid_argument("on a single node rank and local rank must be equal, got rank " +
                                    std::to_string(r.rank()) + " and local rank " + std::to_string(r.local_rank()));
  }
  if (std::chrono::milliseconds(r.timeout_ms()) > max_timeout) {
    return Status::invalid_argument("timeout " + std::to_string(r.timeout_ms()) + " ms exceeds the daemon's maximum of " +
                                    std::to_string(max_timeout.count()) + " ms");
  }
  return Status::ok_status();
}

Status JobRegistry::join(const control::JoinRequest& request, const MemberInfo& member, std::shared_ptr<Job>* job) {
  if (Status status = validate_join(request, options_.max_timeout); !status.ok()) return status;
  auto it = jobs_.find(request.job_id());
  if (it != jobs_.end() && !it->second->failure().ok()) {
    options_.log.info("job=" + request.job_id() + ": re-forming after failure: " + it->second->failure().message());
    jobs_.erase(it);  // members of the failed incarnation keep it alive until they leave
    it = jobs_.end();
  }
  if (it == jobs_.end()) {
    JobOptions options;
    options.params.id = request.job_id();
    options.params.world_size = request.world_size();
    options.params.local_world_size = request.local_world_size();
    options.params.timeout =
        request.timeout_ms() ? std::chrono::milliseconds(request.timeout_ms()) : options_.default_timeout;
    options.incarnation = ++incarnations_;
    options.io = options_.io;
    options.pool = options_.pool;
    options.log = options_.log;
    it = jobs_.emplace(request.job_id(), std::make_shared<Job>(std::move(options))).first;
  }
  const JobParams& p = it->second->params();
  if (p.world_size != request.world_size() || p.local_world_size != request.local_world_size()) {
    return Status::invalid_argument("inconsistent world sizes: job " + p.id + " has world size " +
                                    std::to_string(p.world_size) + " and local world size " +
                                    std::to_string(p.local_world_size) + ", this client says " +
                                    std::to_string(request.world_size()) + " and " +
                                    std::to_string(request.local_world_size()));
  }
  if (Status status = it->second->admit(member); !status.ok()) return status;
  *job = it->second;
  return Status::ok_status();
}

void JobRegistry::left(const std::shared_ptr<Job>& job) {
  auto it = jobs_.find(job->params().id);
  if (it != jobs_.end() && it->second == job && job->empty()) jobs_.erase(it);
}

void JobRegistry::fail_all(const Status& status) {
  for (auto& [id, job] : jobs_) job->fail(status);
}

}  // namespace gradsync
