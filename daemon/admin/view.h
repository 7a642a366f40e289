// DaemonView: what the admin service asks the daemon. The daemon answers from the threads that
// own its state (the io thread; a job's worker thread for its operations), so a call may wait;
// each returns Unavailable, naming what did not answer, rather than block past its bound: a
// daemon whose io thread hangs is exactly what an operator wants to learn.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <optional>

#include "daemon/admin/chrome_trace.h"
#include "daemon/admin/snapshot.h"
#include "daemon/job/job_settings.h"
#include "daemon/job/stats.h"
#include "daemon/util/log.h"
#include "shared/status.h"

namespace gradsync::admin {

struct DaemonStatus {
  std::string version;
  std::chrono::milliseconds uptime{0};
  pid_t pid = 0;
  uid_t uid = 0;
  std::vector<std::string> backends;
  std::vector<std::string> engines;
  std::string devices;
  std::vector<std::pair<std::string, std::string>> config;
  uint32_t jobs = 0;
  uint32_t clients = 0;
  std::string control_socket;
  std::string peer_address;
  uint32_t peer_store_jobs = 0;
  uint64_t peer_store_bytes = 0;
  uint32_t peer_store_waiting_gets = 0;
  std::vector<std::pair<std::string, uint64_t>> peer_calls;  // by method, since the start
  uint64_t peer_get_bytes = 0;  // values its peer service's Get answered, since the start
};

struct JobStatistics {
  JobInfo job;
  JobStatsSnapshot stats;
};

struct JobOperations {
  JobInfo job;
  std::vector<PendingOperation> operations;
  std::string unavailable;  // why there are no operations to show (a worker that did not answer)
  std::vector<RemoteNode> nodes;  // a multi-node job: every other node
};

// SetConfig: what to change, and for which jobs (empty: every job).
struct SettingsChange {
  std::string job;
  std::optional<LogLevel> log_level;
  JobSettings settings;
};

struct JobChange {
  JobInfo job;
  uint64_t from_seq = 0;
  std::string error;  // empty when applied
};

class DaemonView {
 public:
  virtual ~DaemonView() = default;
  virtual Status status(DaemonStatus* out) = 0;
  virtual Status jobs(std::vector<JobInfo>* out) = 0;
  virtual Status clients(std::vector<ClientInfo>* out) = 0;
  // Every job's (or the named job's) operations not finished yet; only `owner`'s jobs when
  // given (nobody else's are looked at, nor their other nodes asked).
  virtual Status in_flight(const std::string& job, std::optional<uid_t> owner, std::vector<JobOperations>* out) = 0;
  // Every job's (or the named job's) statistics; only `owner`'s jobs when given, so that a job
  // of another user is "no job" to the caller, as one that does not exist.
  virtual Status stats(const std::string& job, std::optional<uid_t> owner, std::vector<JobStatistics>* out) = 0;
  // Every job's (or the named job's) last `count` operations (0: all kept); only `owner`'s
  // jobs when given.
  virtual Status traces(const std::string& job, size_t count, std::optional<uid_t> owner,
                        std::vector<JobTrace>* out) = 0;
  // Applies `change`: the log level at once, the job settings at each job's agreed step.
  virtual Status change_settings(const SettingsChange& change, std::vector<JobChange>* out) = 0;
  // Refuses new jobs (or accepts them again) and waits up to `wait` for the jobs there are to
  // end; *left names those still there ("uid.job").
  // `gone` says when the caller stopped waiting (its call was cancelled).
  virtual Status drain(std::chrono::milliseconds wait, bool cancel, const std::function<bool()>& gone, bool* draining,
                       std::vector<std::string>* left) = 0;
  // Who may call the admin service at all: the users allowed on the control socket.
  virtual bool allowed(uid_t uid) const = 0;
  // Who may make mutating calls and see every user's jobs: root, the daemon's own user and
  // the members of the admin group.
  virtual bool privileged(uid_t uid) const = 0;
};

}  // namespace gradsync::admin
