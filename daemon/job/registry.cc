#include "daemon/job/registry.h"

#include "daemon/util/safe_text.h"


namespace gradsync {

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
    options_.jobs.log.info("job=" + request.job_id() + ": re-forming after failure: " + it->second->failure().message());
    it->second->retire();
    jobs_.erase(it);  // members of the failed incarnation keep it alive until they leave
    it = jobs_.end();
  }
  if (params.topology.nodes > 1 && !(options_.jobs.cluster.auth && options_.jobs.cluster.auth->configured())) {
    return Status::invalid_argument(
        "job " + params.id + " spans " + std::to_string(params.topology.nodes) +
        " nodes, but this gradsyncd's peer service is not authenticated (it listens on loopback only): give every "
        "node's gradsyncd --peer-token-file FILE (the same token, e.g. from openssl rand -hex 32) or "
        "--peer-tls-cert, --peer-tls-key and --peer-tls-ca");
  }
  if (it == jobs_.end()) {
    if (!refusing_new_.ok()) return refusing_new_;
    // Its rendezvous store: what is wrong with the rendezvous the trainers named is this join's
    // error, before any job exists.
    std::shared_ptr<RendezvousStore> store;
    if (params.topology.nodes > 1 && options_.jobs.cluster.stores) {
      const Logger log = options_.jobs.log.with("job=" + params.id + " uid=" + std::to_string(params.uid));
      if (Status status = options_.jobs.cluster.stores->open(params.rendezvous, log, &store); !status.ok()) {
        return Status(status.code(), "job " + params.id + ": rendezvous '" + safe_text(params.rendezvous, 256) +
                                         "': " + status.message());
      }
    }
    // Each job has a worker thread (two across nodes): jobs are bounded per user and in all,
    // counting every Job that exists, not just those in this map (a failed job lives on while
    // members stay, and until the reaper has retired it).
    auto ticket = std::make_shared<UserCounts::Ticket>();
    if (Status status = options_.users->take(UserCounts::What::kJobs, member.uid, 1, ticket.get()); !status.ok()) {
      return status;
    }
    JobOptions options;
    options.params = params;
    options.incarnation = ++incarnations_;
    options.services = options_.jobs;
    options.doorbell = std::move(doorbell);
    options.ticket = std::move(ticket);
    options.store = std::move(store);
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
  Status admitted;
  try {
    admitted = it->second->admit(member, std::move(channel), fds);
  } catch (const Error& e) {  // no descriptor left for the doorbell's copy
    admitted = e.status();
  } catch (const std::exception& e) {
    admitted = Status::internal(std::string("admitting the client failed: ") + e.what());
  }
  if (!admitted.ok()) {
    if (it->second->empty()) jobs_.erase(it);  // formed by this join: nobody is in it
    return admitted;
  }
  *job = it->second;
  return Status::ok_status();
}

void JobRegistry::left(const std::shared_ptr<Job>& job) {
  auto it = jobs_.find(Key{job->params().uid, job->params().id});
  if (it != jobs_.end() && it->second == job && job->empty()) {
    job->retire();
    jobs_.erase(it);
  }
}

void JobRegistry::fail_all(const Status& status) {
  for (auto& [id, job] : jobs_) job->fail(status);
}

}  // namespace gradsync
