// All jobs of this daemon, by (uid, id): a job belongs to the user whose clients formed it, and
// another user's join with the same id forms (or joins) that user's own job. Joining finds or forms a job; a failed job is replaced by a
// new incarnation on the next join, while its remaining members keep the old one alive until
// they leave. Runs on the io thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "daemon/util/local_limits.h"
#include "daemon/job/job.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_pool.h"
#include "proto/control.pb.h"
#include "shared/status.h"

namespace gradsync {

struct RegistryOptions {
  JobServices jobs;  // given to every job formed; its log is the registry's too
  std::chrono::milliseconds default_timeout{30'000};
  std::chrono::milliseconds max_timeout{600'000};
  LocalLimits limits;  // local world size (jobs are counted by `users`)
  // Every job holds a ticket here (per user and daemon-wide) until the reaper has retired it.
  // Null: a private one with `limits`.
  std::shared_ptr<UserCounts> users;
};

class JobRegistry {
 public:
  explicit JobRegistry(RegistryOptions options) : options_(std::move(options)) {
    if (!options_.users) options_.users = std::make_shared<UserCounts>(options_.limits);
  }

  // Validates the request, finds or forms its job and admits the member with `channel` as its
  // rings; `doorbell` becomes the job's if this join forms it. Both are made by the caller, off
  // the io thread. On success *job is set.
  Status join(const control::JoinRequest& request, const MemberInfo& member, std::shared_ptr<ClientChannel> channel,
              std::shared_ptr<JobDoorbell> doorbell, std::shared_ptr<Job>* job, Job::ChannelFds* fds);

  // A member left `job`; forgets the job once nobody is in it.
  void left(const std::shared_ptr<Job>& job);

  // Fails every job (daemon shutdown).
  void fail_all(const Status& status);

  size_t size() const { return jobs_.size(); }

  // SIGTERM's drain: joins are refused from now on (the clients hear why).
  void refuse_joins(Status why) { refusing_ = std::move(why); }
  // The admin service's Drain: joins that would form a new job are refused (ok: accepted
  // again); members of the jobs there may still join them.
  void refuse_new_jobs(Status why) { refusing_new_ = std::move(why); }
  bool refusing_new_jobs() const { return !refusing_new_.ok(); }

  // SIGHUP: the bounds new jobs get (running jobs keep theirs).
  void set_timeouts(std::chrono::milliseconds default_timeout, std::chrono::milliseconds max_timeout,
                    std::chrono::milliseconds execution_timeout) {
    options_.default_timeout = default_timeout;
    options_.max_timeout = max_timeout;
    options_.jobs.execution.timeout = execution_timeout;
  }

  // Every job, for the admin service.
  std::vector<std::shared_ptr<Job>> jobs() const {
    std::vector<std::shared_ptr<Job>> all;
    for (const auto& [key, job] : jobs_) all.push_back(job);
    return all;
  }

 private:
  RegistryOptions options_;
  using Key = std::pair<uid_t, std::string>;
  std::map<Key, std::shared_ptr<Job>> jobs_;
  Status refusing_;  // ok unless the daemon is draining
  Status refusing_new_;  // ok unless an operator drains the daemon (Drain)
  uint64_t incarnations_ = 0;
};



}  // namespace gradsync
