#include "daemon/job/registry.h"


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

Status JobRegistry::join(const control::JoinRequest& request, const MemberInfo& member,
                         std::shared_ptr<ClientChannel> channel, std::shared_ptr<JobDoorbell> doorbell,
                         std::shared_ptr<Job>* job, Job::ChannelFds* fds) {
  if (!refusing_.ok()) return refusing_;
  JobParams params;
  if (Status status = validate_join(request, options_.default_timeout, options_.max_timeout, &params); !status.ok()) {
    return status;
  }
  params.uid = member.uid;
  const LocalLimits& limits = options_.limits;
  if (params.local_world_size > static_cast<int>(limits.local_world_size)) {
    return limit_reached("job " + params.id + " declares local world size " + std::to_string(params.local_world_size) +
                             ", at most " + std::to_string(limits.local_world_size) + " ranks per node",
                         "max-local-world-size", limits.local_world_size);
  }
  const Key key{member.uid, request.job_id()};
  auto it = jobs_.find(key);
  if (it != jobs_.end() && !it->second->failure().ok()) {
    options_.log.info("job=" + request.job_id() + ": re-forming after failure: " + it->second->failure().message());
    jobs_.erase(it);  // members of the failed incarnation keep it alive until they leave
    it = jobs_.end();
  }
  if (params.topology.nodes > 1 && !(options_.cluster.auth && options_.cluster.auth->configured())) {
    return Status::invalid_argument(
        "job " + params.id + " spans " + std::to_string(params.topology.nodes) +
        " nodes, but this gradsyncd's peer service is not authenticated (it listens on loopback only): give every "
        "node's gradsyncd --peer-token-file FILE (the same token, e.g. from openssl rand -hex 32) or "
        "--peer-tls-cert, --peer-tls-key and --peer-tls-ca");
  }
  if (it == jobs_.end()) {
    if (!refusing_new_.ok()) return refusing_new_;
    // Each job has a worker thread (two across nodes): jobs are bounded per user and in all,
    // counting every Job that exists, not just those in this map (a failed job lives on while
    // members stay, and until the reaper has retired it).
    auto ticket = std::make_shared<UserCounts::Ticket>();
    if (Status status = options_.users->take(UserCounts::What::kJobs, member.uid, 1, ticket.get()); !status.ok()) {
      return status;
    }
    JobOptions options;
    options.params = params;
    options.cluster = options_.cluster;
    options.reaper = options_.reaper;
    options.incarnation = ++incarnations_;
    options.io = options_.io;
    options.pool = options_.pool;
    options.execution = options_.execution;
    options.log = options_.log;
    options.failures = options_.failures;
    options.progress = options_.progress;
    options.doorbell = std::move(doorbell);
    options.setup = options_.setup;
    options.ticket = std::move(ticket);
    it = jobs_.emplace(key, std::make_shared<Job>(std::move(options))).first;
  }
  const JobParams& p = it->second->params();
  if (p.world_size != request.world_size() || p.local_world_size != request.local_world_size()) {
    return Status::invalid_argument("inconsistent world sizes: job " + p.id + " has world size " +
                                    std::to_string(p.world_size) + " and local world size " +
                                    std::to_string(p.local_world_size) + ", this client says " +
                                    std::to_string(request.world_size()) + " and " +
                                    std::to_string(request.local_world_size()));
  }
  if (p.rendezvous != params.rendezvous) {
    return Status::invalid_argument("inconsistent rendezvous: job " + p.id + " uses '" + p.rendezvous +
                                    "', this client says '" + params.rendezvous + "'");
  }
  if (p.topology.groups != params.topology.groups) {
    return Status::invalid_argument("inconsistent groups: this client declares different process groups than "
                                    "the other clients of job " + p.id);
  }
  if (Status status = it->second->admit(member, std::move(channel), fds); !status.ok()) {
    if (it->second->empty()) jobs_.erase(it);  // formed by this join: nobody is in it
    return status;
  }
  *job = it->second;
  return Status::ok_status();
}

void JobRegistry::left(const std::shared_ptr<Job>& job) {
  auto it = jobs_.find(Key{job->params().uid, job->params().id});
  if (it != jobs_.end() && it->second == job && job->empty()) jobs_.erase(it);
}

void JobRegistry::fail_all(const Status& status) {
  for (auto& [id, job] : jobs_) job->fail(status);
}

}  // namespace gradsync
