// The daemon: owns the io_context, the reduction thread pool, the job registry and the control
// server, and runs until SIGTERM or SIGINT. Two Daemons can live in one process (tests).
#pragma once

#include <functional>
#include <map>
#include <memory>

#include "daemon/admin/admin_server.h"
#include "daemon/admin/daemon_view.h"
#include "daemon/admin/metrics_server.h"
#include "daemon/backend/factory.h"
#include "daemon/config/config.h"
#include "daemon/engine/factory.h"
#include "daemon/control/asio.h"
#include "daemon/control/server.h"
#include "daemon/util/setup_threads.h"
#include "daemon/job/reaper.h"
#include "daemon/job/registry.h"
#include "daemon/peer/peer_server.h"
#include "daemon/test_hooks.h"
#include "daemon/util/log.h"
#include "daemon/util/sd_notify.h"
#include "daemon/util/thread_pool.h"

namespace gradsync {

class Daemon {
 public:
  // Binds the control socket; throws Error when it cannot. `reparse` reads the configuration
  // again (the same flags and file) for SIGHUP; without it SIGHUP is logged and ignored.
  // `hooks`: faults a test wants acted out (test_hooks.h); none in production.
  explicit Daemon(DaemonConfig config, std::function<ParsedConfig()> reparse = {}, TestHooks hooks = {});
  ~Daemon();

  // Serves until a stop signal or stop(); returns the process exit code: 0, or kExitGpuLost.
  int run();

  // The exit status after a sticky CUDA error broke the daemon's context on a GPU: only a new
  // process recovers, so the daemon drains and exits with it, and systemd restarts it
  // (Restart=on-failure). EX_TEMPFAIL.
  static constexpr int kExitGpuLost = 75;

  // GPU work of a failed job never drained and may still touch memory the daemon keeps mapped
  // for it (BackendFactory::keep_until_exit): the process must end without tearing down.
  bool keeps_undrained_gpu_memory() const { return backends_ && backends_->keeps_undrained_memory(); }
  void stop();

 private:
  DaemonConfig config_;
  Logger log_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  ThreadPool pool_;
  // Channel and segment setup and large requests, off the io thread; destroyed (joined) before
  // the io_context and after everything that posts to it.
  SetupThreads setup_{io_, 2};
  std::shared_ptr<UserCounts> users_;  // what each local user holds (local_limits.h)
  // The device engines (NCCL) outlive the backends, whose executors use them.
  std::unique_ptr<DeviceEngineFactory> device_engines_;
  std::unique_ptr<BackendFactory> backends_;
  std::unique_ptr<HostEngineFactory> engines_;
  ProgressBoard progress_;  // outlives the peer server, which reads it, and the jobs on it
  std::shared_ptr<const PeerAuth> peer_auth_;  // how this daemon and its peers prove membership
  std::unique_ptr<PeerServer> peer_;
  std::unique_ptr<Reaper> reaper_;  // outlives the jobs, whose workers it stops
  DaemonCounters failures_;  // outlives the registry's jobs and the metrics server
  std::unique_ptr<JobRegistry> registry_;
  std::unique_ptr<ControlServer> server_;
  std::unique_ptr<admin::IoDaemonView> admin_view_;  // before the admin and metrics servers, which use it
  std::unique_ptr<admin::AdminServer> admin_;
  std::unique_ptr<admin::MetricsServer> metrics_;
  // systemd: READY=1 once every socket listens, WATCHDOG=1 from a timer on the io thread (so
  // the pings stop if that thread hangs), STOPPING=1 at shutdown.
  SystemdNotifier systemd_;
  boost::asio::steady_timer watchdog_timer_{io_};
  bool stopping_ = false;  // STOPPING=1 was sent (drain() or stop())
  int exit_code_ = 0;      // io thread only; kExitGpuLost after a sticky CUDA error
  bool stopped_ = false;   // stop() ran (the destructor calls it again)
  // SIGTERM: refuses joins, lets the operations already submitted finish (bounded), then stop().
  void drain();
  // A sticky CUDA error broke GPU `device` (any thread): drain, then exit with kExitGpuLost.
  void gpu_lost(int device, const Status& why);
  // Every 10 ms until each job in `targets` completed that many operations, or `deadline`.
  void drain_check(std::map<std::pair<uid_t, std::string>, uint64_t> targets,
                   std::chrono::steady_clock::time_point deadline);
  boost::asio::steady_timer drain_timer_{io_};
  std::chrono::steady_clock::time_point drain_started_;
  // SIGHUP: reads the configuration again and applies what can change without a restart.
  std::function<ParsedConfig()> reparse_;
  TestHooks hooks_;
  void arm_test_hooks();
  boost::asio::signal_set reload_signals_{io_, SIGHUP};
  void wait_for_reload();
  void reload();
  void ping_watchdog();
};

}  // namespace gradsync
