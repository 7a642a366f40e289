// The daemon's side of the admin service: answers DaemonView from the io thread (and, for
// operations in flight, from each job's worker thread), waiting a bounded time for them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "daemon/admin/view.h"
#include "daemon/backend/factory.h"
#include "daemon/config/config.h"
#include "daemon/control/asio.h"
#include "daemon/control/server.h"
#include "daemon/job/registry.h"
#include "daemon/peer/kv_store.h"
#include "daemon/peer/peer_calls.h"
#include "daemon/peer/peer_auth.h"
#include "daemon/util/log.h"
#include "shared/mutex.h"

namespace gradsync::admin {

struct IoDaemonViewOptions {
  boost::asio::io_context* io = nullptr;
  DaemonConfig config;  // in effect; replaced by set_config() (SIGHUP)
  JobRegistry* registry = nullptr;   // io thread only
  ControlServer* server = nullptr;   // io thread only
  BackendFactory* backends = nullptr;
  std::vector<std::string> engines;  // "gloo/tcp", "nccl"
  std::string peer_address;
  std::chrono::milliseconds answer_within{2000};
  // How long GetInFlight waits for another node's daemon before reporting it unreachable.
  std::chrono::milliseconds probe_within{1000};
  Logger log;  // the daemon's: SetConfig changes its level
  std::shared_ptr<const PeerAuth> peer_auth;  // for asking other nodes (GetInFlight)
  KvStore* peer_store = nullptr;               // its usage, for status; outlives the view
  const PeerCallCounts* peer_calls = nullptr;  // the peer service's calls; outlives the view
};

class IoDaemonView final : public DaemonView {
 public:
  explicit IoDaemonView(IoDaemonViewOptions options)
      : options_(std::move(options)), config_(options_.config), started_(std::chrono::steady_clock::now()) {}

  Status status(DaemonStatus* out) override;
  Status jobs(std::vector<JobInfo>* out) override;
  Status clients(std::vector<ClientInfo>* out) override;
  Status in_flight(const std::string& job, std::optional<uid_t> owner, std::vector<JobOperations>* out) override;
  Status stats(const std::string& job, std::optional<uid_t> owner, std::vector<JobStatistics>* out) override;
  Status traces(const std::string& job, size_t count, std::optional<uid_t> owner, std::vector<JobTrace>* out) override;
  Status change_settings(const SettingsChange& change, std::vector<JobChange>* out) override;
  Status drain(std::chrono::milliseconds wait, bool cancel, const std::function<bool()>& gone, bool* draining,
               std::vector<std::string>* left) override;
  bool allowed(uid_t uid) const override;
  bool privileged(uid_t uid) const override;
  void set_config(const DaemonConfig& config);

 private:
  DaemonConfig config() const;

  IoDaemonViewOptions options_;
  mutable Mutex config_mutex_;
  // In effect: options.config at first, replaced by set_config() (SIGHUP). (options_.config is
  // not read after the constructor.)
  DaemonConfig config_ GS_GUARDED_BY(config_mutex_);
  std::chrono::steady_clock::time_point started_;
};

}  // namespace gradsync::admin
