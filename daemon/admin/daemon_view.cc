#include "daemon/admin/daemon_view.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "daemon/admin/group_membership.h"
#include "daemon/admin/remote_progress.h"
#include "daemon/config/setting.h"
#include "daemon/util/local_limits.h"
#include "daemon/peer/peer_client.h"
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
  MutexLock lock(config_mutex_);
  return config_;
}

void IoDaemonView::set_config(const DaemonConfig& config) {
  MutexLock lock(config_mutex_);
  config_ = config;
}

// The control socket's rule (root, and the daemon's own user unless --allow-uid lists users).
bool IoDaemonView::allowed(uid_t uid) const {
  if (uid == 0) return true;
  MutexLock lock(config_mutex_);
  const auto& allowed = config_.allowed_uids;
  if (allowed.empty()) return uid == ::geteuid();
  return std::find(allowed.begin(), allowed.end(), uid) != allowed.end();
}

bool IoDaemonView::privileged(uid_t uid) const {
  if (uid == 0 || uid == ::geteuid()) return true;
  const std::string group = config().admin_group;
  return !group.empty() && user_in_group(uid, group);
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
  if (options_.peer_store) {
    const KvStore::Usage usage = options_.peer_store->usage();
    s.peer_store_jobs = static_cast<uint32_t>(usage.jobs);
    s.peer_store_bytes = usage.bytes;
    s.peer_store_waiting_gets = static_cast<uint32_t>(usage.waiters);
  }
  if (options_.peer_calls) {
    s.peer_calls = options_.peer_calls->snapshot();
    s.peer_get_bytes = options_.peer_calls->get_bytes();
  }
  // Every setting gradsyncd runs with, as declared (config/settings.cc); the log level as it is
  // now (config set may have changed it); and the peer service's authentication, which two
  // settings decide.
  DaemonConfig shown = c;
  shown.log_level = options_.log.level();
  for (const SettingSpec& setting : daemon_settings()) s.config.push_back({setting.name, setting.show(shown)});
  s.config.push_back({"peer-auth", c.peer_tls_ca.empty()
                                       ? (c.peer_token_file.empty() ? "none (loopback only, single-node jobs)"
                                                                    : "cluster token")
                                       : (c.peer_token_file.empty() ? "mutual TLS" : "mutual TLS and cluster token")});
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

Status IoDaemonView::stats(const std::string& wanted, std::optional<uid_t> owner, std::vector<JobStatistics>* out) {
  std::vector<std::pair<JobInfo, std::shared_ptr<const JobStats>>> jobs;
  if (Status s = on_io(options_.io, options_.answer_within,
                       [this, wanted, owner] {
                         std::vector<std::pair<JobInfo, std::shared_ptr<const JobStats>>> matching;
                         for (const auto& job : options_.registry->jobs()) {
                           if (!wanted.empty() && job->params().id != wanted) continue;
                           if (owner && job->params().uid != *owner) continue;
                           matching.emplace_back(job->info(), job->stats());
                         }
                         return matching;
                       },
                       &jobs);
      !s.ok()) {
    return s;
  }
  if (!wanted.empty() && jobs.empty()) {
    return Status::not_found("no job '" + wanted + "'" + (owner ? " of uid " + std::to_string(*owner) : "") +
                             " on this gradsyncd");
  }
  for (auto& [info, stats] : jobs) out->push_back(JobStatistics{std::move(info), stats->snapshot()});
  return Status();
}

Status IoDaemonView::in_flight(const std::string& wanted, std::optional<uid_t> owner, std::vector<JobOperations>* out) {
  // Every job's worker answers on its own thread; a worker that does not answer in time is
  // reported as such rather than waited for. Only values leave the io thread: a Job must be
  // released there (its destructor is io-thread only).
  struct Shared {
    Mutex mutex;
    std::vector<std::optional<std::vector<PendingOperation>>> answers;
    std::vector<std::shared_ptr<std::promise<void>>> answered;
    std::vector<std::vector<std::string>> node_addresses;  // multi-node jobs: every node's daemon
    std::vector<std::string> store_jobs;
  };
  auto shared = std::make_shared<Shared>();
  std::vector<JobInfo> infos;
  if (Status s = on_io(options_.io, options_.answer_within,
                       [this, wanted, owner, shared] {
                         std::vector<JobInfo> matching;
                         for (const auto& job : options_.registry->jobs()) {
                           if (!wanted.empty() && job->params().id != wanted) continue;
                           if (owner && job->params().uid != *owner) continue;
                           matching.push_back(job->info());
                           const size_t i = shared->answers.size();
                           shared->answers.emplace_back();
                           shared->node_addresses.push_back(job->worker()->node_addresses());
                           shared->store_jobs.push_back(job->store_job());
                           auto done = std::make_shared<std::promise<void>>();
                           shared->answered.push_back(done);
                           job->in_flight([shared, i, done](std::vector<PendingOperation> ops) {
                             MutexLock lock(shared->mutex);
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
  // Meanwhile, every other node of each multi-node job is asked where it is (remote_progress.h):
  // one that does not answer within the probe bound is reported unreachable, not waited for,
  // and those whose turn has not come when the view's own bound is up are not asked.
  std::vector<NodeToAsk> others;
  for (size_t i = 0; i < infos.size(); ++i) {
    const auto& addresses = shared->node_addresses[i];
    for (size_t n = 0; n < addresses.size(); ++n) {
      if (static_cast<int>(n) != infos[i].node) others.push_back(NodeToAsk{i, static_cast<int>(n), addresses[n]});
    }
  }
  const AskNode ask = [shared, within = options_.probe_within, auth = options_.peer_auth](const NodeToAsk& node) {
    RemoteNode remote;
    remote.node = node.node;
    remote.address = node.address;
    PeerClient client(node.address, auth);
    peer::ProgressReply reply;
    if (Status s = client.progress(shared->store_jobs[node.job], within, &reply); !s.ok()) {
      remote.unreachable = true;
      remote.error = s.message();
    } else if (!reply.found()) {
      remote.error = "its daemon does not have this job (it ended there, or never formed)";
    } else {
      remote.operations_done = reply.operations_done();
      remote.current_seq = reply.current_seq();
      remote.current_bucket = reply.current_bucket();
      remote.executing = reply.executing();
      remote.error = reply.failure();
    }
    return remote;
  };
  std::vector<std::vector<RemoteNode>> remotes =
      ask_nodes(others, infos.size(), std::chrono::steady_clock::now() + options_.answer_within, ask);
  const auto deadline = std::chrono::steady_clock::now() + options_.answer_within;
  for (auto& done : shared->answered) done->get_future().wait_until(deadline);
  MutexLock lock(shared->mutex);
  for (size_t i = 0; i < infos.size(); ++i) {
    JobOperations entry;
    entry.job = infos[i];
    entry.nodes = remotes[i];
    if (entry.job.state == "failed") {
      entry.unavailable = "the job failed: " + entry.job.last_error;
    } else if (shared->answers[i]) {
      entry.operations = *shared->answers[i];
      // The head operation: which nodes have not reached its oldest unfinished bucket.
      if (!entry.operations.empty() && !entry.operations.front().buckets.empty()) {
        PendingOperation& head = entry.operations.front();
        const uint32_t bucket = head.buckets.front().bucket;
        for (const RemoteNode& remote : entry.nodes) {
          if (remote.not_asked) continue;
          const bool reached = !remote.unreachable && remote.error.empty() &&
                               (remote.operations_done >= head.seq ||
                                (remote.current_seq == head.seq &&
                                 (remote.current_bucket > bucket || (remote.current_bucket == bucket && remote.executing))));
          if (!reached) head.nodes_behind.push_back(remote);
        }
      }
    } else {
      entry.unavailable = "the job's worker thread did not answer within " + ms(options_.answer_within) +
                          " ms (busy, or hung)";
    }
    out->push_back(std::move(entry));
  }
  return Status();
}

}  // namespace gradsync::admin

namespace gradsync::admin {

Status IoDaemonView::traces(const std::string& wanted, size_t count, std::optional<uid_t> owner,
                            std::vector<JobTrace>* out) {
  std::vector<std::pair<JobInfo, std::shared_ptr<const TraceLog>>> jobs;
  if (Status s = on_io(options_.io, options_.answer_within,
                       [this, wanted, owner] {
                         std::vector<std::pair<JobInfo, std::shared_ptr<const TraceLog>>> matching;
                         for (const auto& job : options_.registry->jobs()) {
                           if (owner && job->params().uid != *owner) continue;
                           if (wanted.empty() || job->params().id == wanted) matching.emplace_back(job->info(), job->trace());
                         }
                         return matching;
                       },
                       &jobs);
      !s.ok()) {
    return s;
  }
  if (!wanted.empty() && jobs.empty()) return Status::not_found("no job '" + wanted + "' on this gradsyncd");
  for (auto& [info, trace] : jobs) out->push_back(JobTrace{std::move(info), trace->last(count)});
  return Status();
}

Status IoDaemonView::change_settings(const SettingsChange& change, std::vector<JobChange>* out) {
  const DaemonConfig c = config();
  if (change.settings.timeout && (change.settings.timeout->count() <= 0 || *change.settings.timeout > c.max_timeout)) {
    return Status::invalid_argument("timeout_ms must be between 1 and --max-timeout-ms (" + ms(c.max_timeout) +
                                    "), not " + ms(*change.settings.timeout));
  }
  if (std::string bad = change.settings.invalid(); !bad.empty()) return Status::invalid_argument(bad);
  using Target = std::pair<JobInfo, std::shared_ptr<Worker>>;
  std::vector<Target> targets;
  if (!change.settings.empty() || !change.job.empty()) {
    if (Status s = on_io(options_.io, options_.answer_within,
                         [this, wanted = change.job] {
                           std::vector<Target> matching;
                           for (const auto& job : options_.registry->jobs()) {
                             if (!wanted.empty() && job->params().id != wanted) continue;
                             matching.emplace_back(job->info(), job->worker());
                           }
                           return matching;
                         },
                         &targets);
        !s.ok()) {
      return s;
    }
    if (!change.job.empty() && targets.empty()) return Status::not_found("no job '" + change.job + "' on this gradsyncd");
  }
  if (change.log_level) {
    options_.log.set_level(*change.log_level);
    options_.log.info(std::string("SetConfig: log level ") + std::string(log_level_name(*change.log_level)));
  }
  if (change.settings.empty()) return Status();
  // Up to kParallelChanges jobs at a time (as the probes of GetInFlight): each change may wait
  // for its nodes to agree, up to the job's timeout (at most 60 s); a single-node job's is
  // immediate.
  const auto change_one = [this, settings = change.settings](const JobInfo& info, Worker& worker) {
    JobChange result;
    result.job = info;
    if (info.state != "running") {
      result.error = "the job failed: " + info.last_error;
      return result;
    }
    if (Status s = worker.change_settings(settings, std::chrono::milliseconds(60'000), &result.from_seq); !s.ok()) {
      result.error = s.message();
    } else {
      options_.log.info("SetConfig: job " + info.id + " (uid " + std::to_string(info.uid) + "): " + settings.describe() +
                        " from operation " + std::to_string(result.from_seq));
    }
    return result;
  };
  constexpr size_t kParallelChanges = 16;
  for (size_t first = 0; first < targets.size(); first += kParallelChanges) {
    std::vector<std::future<JobChange>> batch;
    for (size_t t = first; t < std::min(targets.size(), first + kParallelChanges); ++t) {
      batch.push_back(std::async(std::launch::async, [&change_one, &target = targets[t]] {
        return change_one(target.first, *target.second);
      }));
    }
    for (auto& f : batch) out->push_back(f.get());
  }
  return Status();
}

Status IoDaemonView::drain(std::chrono::milliseconds wait, bool cancel, const std::function<bool()>& gone,
                           bool* draining, std::vector<std::string>* left) {
  const Status why = Status::aborted("gradsyncd is draining (gradsyncctl drain): it takes no new jobs");
  bool ok = false;
  if (Status s = on_io(options_.io, options_.answer_within,
                       [this, cancel, why] {
                         options_.registry->refuse_new_jobs(cancel ? Status() : why);
                         return true;
                       },
                       &ok);
      !s.ok()) {
    return s;
  }
  options_.log.info(cancel ? "Drain cancelled: new jobs are accepted again"
                           : "Drain: new jobs are refused; waiting up to " + ms(wait) + " ms for the " +
                                 "jobs there are to end");
  *draining = !cancel;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    std::vector<std::string> names;
    if (Status s = on_io(options_.io, options_.answer_within,
                         [this] {
                           std::vector<std::string> all;
                           for (const auto& job : options_.registry->jobs()) all.push_back(job->store_job());
                           return all;
                         },
                         &names);
        !s.ok()) {
      return s;
    }
    if (cancel || names.empty() || std::chrono::steady_clock::now() >= deadline || (gone && gone())) {
      *left = std::move(names);
      return Status();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace gradsync::admin
