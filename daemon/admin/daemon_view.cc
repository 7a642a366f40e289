#include "daemon/admin/daemon_view.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <memory>
#include <mutex>
#include <optional>

#include "shared/version.h"

namespace gradsync::admin {
namespace {

// Runs `work` on the io thread and waits up to `within` for it; Unavailable when the io thread
// did not get to it (busy, or hung: which is what the operator needs to know).
template <class T, class F>
Status on_io(boost::asio::io_context* io, std::chrono::milliseconds within, F work, T* out) {
  auto result = std::make_shared<std::promise<T>>();
  auto answer = result->get_future();
  boost::asio::post(*io, [result, work = std::move(work)] {
    try {
      result->set_value(work());
    } catch (...) {  // never out of io_.run()
      result->set_exception(std::current_exception());
    }
  });
  if (answer.wait_for(within) != std::future_status::ready) {
    return Status(ErrorCode::kTimeout, "gradsyncd's io thread did not answer within " + std::to_string(within.count()) +
                                           " ms (busy, or hung)");
  }
  try {
    *out = answer.get();
  } catch (const std::exception& e) {
    return Status::internal(std::string("the admin query failed on the io thread: ") + e.what());
  }
  return Status();
}

std::string ms(std::chrono::milliseconds value) { return std::to_string(value.count()); }

}  // namespace

DaemonConfig IoDaemonView::config() const {
  std::lock_guard lock(config_mutex_);
  return options_.config;
}

void IoDaemonView::set_config(const DaemonConfig& config) {
  std::lock_guard lock(config_mutex_);
  options_.config = config;
}

// The control socket's rule (root, and the daemon's own user unless --allow-uid lists users).
bool IoDaemonView::allowed(uid_t uid) const {
  if (uid == 0) return true;
  std::lock_guard lock(config_mutex_);
  const auto& allowed = options_.config.allowed_uids;
  if (allowed.empty()) return uid == ::geteuid();
  return std::find(allowed.begin(), allowed.end(), uid) != allowed.end();
}

Status IoDaemonView::status(DaemonStatus* out) {
  const DaemonConfig c = config();
  DaemonStatus s;
  s.version = kGradsyncVersion;
  s.uptime = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_);
  s.pid = ::getpid();
  s.uid = ::getuid();
  s.backends = options_.backends->memory_kinds();
  s.engines = options_.engines;
  s.devices = options_.backends->devices();
  s.control_socket = c.socket_path;
  s.peer_address = options_.peer_address;
  std::string allowed;
  for (uid_t uid : c.allowed_uids) allowed += (allowed.empty() ? "" : ",") + std::to_string(uid);
  std::string legacy;
  for (uid_t uid : c.legacy_ipc_uids) legacy += (legacy.empty() ? "" : ",") + std::to_string(uid);
  s.config = {{"socket", c.socket_path},
              {"admin", c.admin_address},
              {"timeout-ms", ms(c.default_timeout)},
              {"max-timeout-ms", ms(c.max_timeout)},
              {"execution-timeout-ms", ms(c.execution_timeout)},
              {"reduce-threads", std::to_string(c.reduce_threads)},
              {"allow-uid", allowed.empty() ? "(own user and root)" : allowed},
              {"legacy-ipc-uid", legacy.empty() ? "(nobody)" : legacy},
              {"nccl-keep-idle-s", std::to_string(c.nccl_keep_idle.count())},
              {"log-level", std::string(log_level_name(c.log_level))},
              {"peer-listen", c.peer_listen},
              {"gloo-transport", c.gloo_transport}};
  std::pair<uint32_t, uint32_t> counts{0, 0};
  if (Status st = on_io(options_.io, options_.answer_within,
                        [this] {
                          return std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(options_.registry->size()),
                                                               static_cast<uint32_t>(options_.server->clients().size()));
                        },
                        &counts);
      !st.ok()) {
    return st;
  }
  s.jobs = counts.first;
  s.clients = counts.second;
  *out = std::move(s);
  return Status();
}

Status IoDaemonView::jobs(std::vector<JobInfo>* out) {
  return on_io(options_.io, options_.answer_within,
               [this] {
                 std::vector<JobInfo> all;
                 for (const auto& job : options_.registry->jobs()) all.push_back(job->info());
                 return all;
               },
               out);
}

Status IoDaemonView::clients(std::vector<ClientInfo>* out) {
  return on_io(options_.io, options_.answer_within, [this] { return options_.server->clients(); }, out);
}

Status IoDaemonView::stats(const std::string& wanted, std::vector<JobStatistics>* out) {
  std::vector<std::pair<JobInfo, std::shared_ptr<const JobStats>>> jobs;
  if (Status s = on_io(options_.io, options_.answer_within,
                       [this, wanted] {
                         std::vector<std::pair<JobInfo, std::shared_ptr<const JobStats>>> matching;
                         for (const auto& job : options_.registry->jobs()) {
                           if (wanted.empty() || job->params().id == wanted) matching.emplace_back(job->info(), job->stats());
                         }
                         return matching;
                       },
                       &jobs);
      !s.ok()) {
    return s;
  }
  if (!wanted.empty() && jobs.empty()) return Status::not_found("no job '" + wanted + "' on this gradsyncd");
  for (auto& [info, stats] : jobs) out->push_back(JobStatistics{std::move(info), stats->snapshot()});
  return Status();
}

Status IoDaemonView::in_flight(const std::string& wanted, std::vector<JobOperations>* out) {
  // Every job's worker answers on its own thread; a worker that does not answer in time is
  // reported as such rather than waited for. Only values leave the io thread: a Job must be
  // released there (its destructor is io-thread only).
  struct Shared {
    std::mutex mutex;
    std::vector<std::optional<std::vector<PendingOperation>>> answers;
    std::vector<std::shared_ptr<std::promise<void>>> answered;
  };
  auto shared = std::make_shared<Shared>();
  std::vector<JobInfo> infos;
  if (Status s = on_io(options_.io, options_.answer_within,
                       [this, wanted, shared] {
                         std::vector<JobInfo> matching;
                         for (const auto& job : options_.registry->jobs()) {
                           if (!wanted.empty() && job->params().id != wanted) continue;
                           matching.push_back(job->info());
                           const size_t i = shared->answers.size();
                           shared->answers.emplace_back();
                           auto done = std::make_shared<std::promise<void>>();
                           shared->answered.push_back(done);
                           job->in_flight([shared, i, done](std::vector<PendingOperation> ops) {
                             std::lock_guard lock(shared->mutex);
                             shared->answers[i] = std::move(ops);
                             done->set_value();
                           });
                         }
                         return matching;
                       },
                       &infos);
      !s.ok()) {
    return s;
  }
  if (!wanted.empty() && infos.empty()) return Status::not_found("no job '" + wanted + "' on this gradsyncd");
  const auto deadline = std::chrono::steady_clock::now() + options_.answer_within;
  for (auto& done : shared->answered) done->get_future().wait_until(deadline);
  std::lock_guard lock(shared->mutex);
  for (size_t i = 0; i < infos.size(); ++i) {
    JobOperations entry;
    entry.job = infos[i];
    if (entry.job.state == "failed") {
      entry.unavailable = "the job failed: " + entry.job.last_error;
    } else if (shared->answers[i]) {
      entry.operations = *shared->answers[i];
    } else {
      entry.unavailable = "the job's worker thread did not answer within " + ms(options_.answer_within) +
                          " ms (busy, or hung)";
    }
    out->push_back(std::move(entry));
  }
  return Status();
}

}  // namespace gradsync::admin
