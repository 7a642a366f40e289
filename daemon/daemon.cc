#include "daemon/daemon.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "daemon/config/setting.h"
#include "daemon/rendezvous/etcd_access.h"
#include "daemon/rendezvous/store_opener.h"
#include "shared/host_port.h"
#include "shared/version.h"

namespace gradsync {

namespace {

// The host part of the advertised peer address: explicit, or the listen host unless that is a
// wildcard, in which case this machine's hostname.
std::string advertise_host(const DaemonConfig& config) {
  if (!config.peer_advertise_host.empty()) return config.peer_advertise_host;
  HostPort listen;  // checked by parse_daemon_config
  if (std::string why; !parse_host_port(config.peer_listen, &listen, &why) || !listen.wildcard()) {
    return listen.host_text();
  }
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

Daemon::Daemon(DaemonConfig config, std::function<ParsedConfig()> reparse, TestHooks hooks)
    : config_(std::move(config)),
      log_(config_.log_level),
      signals_(io_, SIGINT, SIGTERM),
      pool_(config_.reduce_threads),
      reparse_(std::move(reparse)),
      hooks_(hooks) {
  // A client that vanishes mid-write must not kill the daemon.
  std::signal(SIGPIPE, SIG_IGN);
  // Every client connection holds a few descriptors while it sets up; use what the hard limit
  // allows rather than the 1024 of a login shell.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  // The reserve: the listeners other than the control socket hold at most these (peer port:
  // tcp_listener.h; admin socket: admin_server.h); the rest stay for trainers and their jobs.
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    const size_t limit = files.rlim_cur;
    const size_t peer = std::min<size_t>(4096, limit / 4), admin = std::min<size_t>(1024, limit / 8);
    log_.info("descriptors: " + std::to_string(limit) + "; peer connections take at most " + std::to_string(peer) +
              ", admin connections " + std::to_string(admin) + " (and 256 on an admin TLS port), the other " +
              std::to_string(limit > peer + admin + 256 ? limit - peer - admin - 256 : 0) + " or more are kept for trainers and their jobs");
  }
  {
    // Segments of all users stay within half of the kernel's mappings per process.
    LocalLimits limits = config_.limits;
    std::ifstream max_map_count("/proc/sys/vm/max_map_count");
    uint64_t maps = 0;
    if (max_map_count >> maps && maps >= 2) limits.segments_total = static_cast<uint32_t>(std::min<uint64_t>(maps / 2, UINT32_MAX));
    // Byte budgets left at 0 follow the machine's memory.
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    resolve_byte_limits(pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0, &limits);
    log_.info("memory budgets: a segment at most " + describe_bytes(limits.segment_bytes) + ", a user " +
              describe_bytes(limits.bytes_per_user) + ", all users " + describe_bytes(limits.bytes_total));
    users_ = std::make_shared<UserCounts>(limits);
  }
  device_engines_ = make_device_engine_factory(config_.nccl_keep_idle);
  backends_ = make_backend_factory(
      log_, device_engines_.get(),
      std::vector<uint32_t>(config_.legacy_ipc_uids.begin(), config_.legacy_ipc_uids.end()),
      [this](int device, const Status& why) { gpu_lost(device, why); });
  {
    PeerAuth auth;
    if (Status s = PeerAuth::load(config_.peer_token_file, config_.peer_tls_cert, config_.peer_tls_key,
                                  config_.peer_tls_ca, &auth);
        !s.ok()) {
      throw Error(s);
    }
    auth.channels = std::make_shared<PeerChannels>();
    peer_auth_ = std::make_shared<const PeerAuth>(std::move(auth));
  }
  // Read now: a missing certificate or an unreadable password is a start-up error.
  std::shared_ptr<const EtcdAccess> etcd;
  if (Status s = EtcdAccess::load(config_.etcd, config_.peer_key_ttl, &etcd); !s.ok()) throw Error(s);
  PeerServerOptions peer{config_.peer_listen, log_, {}, peer_auth_, {}};
  peer.limits.job_ttl = config_.peer_key_ttl;
  peer.progress = [board = &progress_](const std::string& job, peer::ProgressReply* reply) {
    const auto entry = board->find(job);
    if (!entry) return false;
    reply->set_operations_done(entry->position.operations_done);
    reply->set_current_seq(entry->position.current_seq);
    reply->set_current_bucket(entry->position.current_bucket);
    reply->set_executing(entry->position.executing);
    reply->set_failure(entry->failure);
    return true;
  };
  // A job this daemon runs bounds the node claims at its own peer store, and, as node 0 of a
  // job whose rendezvous it is, keeps node 0 for itself (key_scope.h).
  peer.jobs = [board = &progress_, auth = peer_auth_](const std::string& job) -> std::optional<KeyScope::LocalJob> {
    const auto shape = board->shape(job);
    if (!shape) return std::nullopt;
    return KeyScope::LocalJob{shape->nodes, shape->node == 0 ? auth->instance_for(shape->rendezvous, job) : ""};
  };
  peer_ = std::make_unique<PeerServer>(std::move(peer));
  reaper_ = std::make_unique<Reaper>();
  RegistryOptions registry;
  registry.jobs.io = &io_;
  registry.jobs.pool = &pool_;
  registry.jobs.log = log_;
  registry.jobs.reaper = reaper_.get();
  registry.jobs.failures = &failures_;
  registry.jobs.setup = &setup_;
  registry.jobs.progress = &progress_;
  registry.default_timeout = config_.default_timeout;
  registry.max_timeout = config_.max_timeout;
  registry.limits = config_.limits;
  registry.users = users_;
  const std::string host = advertise_host(config_);
  registry.jobs.cluster.advertise = host + ":" + std::to_string(peer_->port());
  GlooTransport gloo;
  gloo.transport = config_.gloo_transport;
  gloo.hostname = host;
  gloo.iface = config_.gloo_iface;
  gloo.ib_device = config_.gloo_ib_device;
  gloo.ib_port = config_.gloo_ib_port;
  gloo.ib_index = config_.gloo_ib_index;
  gloo.slice_bytes = config_.gloo_slice_bytes;
  engines_ = make_host_engine_factory(gloo);
  registry.jobs.cluster.engines = engines_.get();
  {
    // Every proof this daemon makes names it by its advertised peer address: the member its
    // peers' stores charge (kv_store.h).
    PeerAuth named = *peer_auth_;
    named.node = registry.jobs.cluster.advertise;
    peer_auth_ = std::make_shared<const PeerAuth>(std::move(named));
  }
  registry.jobs.cluster.auth = peer_auth_;
  registry.jobs.cluster.stores = std::make_shared<const StoreOpener>(peer_auth_, etcd);
  registry.jobs.execution = ExecutionSettings{backends_.get(), config_.execution_timeout,
                                              IntegrityCheck{config_.integrity_check_every, hooks_.corrupt_result_at_op,
                                                             hooks_.fail_alloc_at_op}};
  registry_ = std::make_unique<JobRegistry>(std::move(registry));
  server_ = std::make_unique<ControlServer>(
      io_, ControlServerOptions{config_.socket_path, config_.allowed_uids,
                                ControlContext{registry_.get(), backends_.get(), &setup_, users_}, log_,
                                config_.connection_timeout});
  if (config_.admin_address != "none" || !config_.admin_tcp.empty() || !config_.metrics_address.empty()) {
    admin::IoDaemonViewOptions view;
    view.io = &io_;
    view.config = config_;
    view.registry = registry_.get();
    view.server = server_.get();
    view.backends = backends_.get();
    view.engines = {"gloo/" + config_.gloo_transport};
    if (device_engines_) view.engines.push_back("nccl (loaded on first use)");
    view.peer_address = host + ":" + std::to_string(peer_->port());
    view.log = log_;
    view.peer_auth = peer_auth_;
    view.peer_store = &peer_->store();
    view.peer_calls = &peer_->calls();
    admin_view_ = std::make_unique<admin::IoDaemonView>(std::move(view));
  }
  if (config_.admin_address != "none" || !config_.admin_tcp.empty()) {
    admin::AdminServerOptions admin{config_.admin_address, admin_view_.get(), log_, !config_.allowed_uids.empty(), {}};
    admin.tcp = admin::AdminTls{config_.admin_tcp, config_.admin_tls_cert, config_.admin_tls_key, config_.admin_tls_ca,
                                config_.admin_tls_admin_cns};
    admin_ = std::make_unique<admin::AdminServer>(std::move(admin));
  }
  if (!config_.metrics_address.empty()) {
    metrics_ = std::make_unique<admin::MetricsServer>(
        admin::MetricsServerOptions{config_.metrics_address, admin_view_.get(), &failures_, log_});
  }
}

Daemon::~Daemon() {
  admin_.reset();  // no admin call or scrape reaches into what goes below
  metrics_.reset();
  stop();
  // Setup work in flight (an import through the backends) finishes before anything it uses goes.
  setup_.join();
  // Whatever is still queued (a session that was mid-shutdown) completes before the registry,
  // the pool and the io_context are destroyed.
  io_.restart();
  io_.run_for(std::chrono::seconds(5));
  server_.reset();
  registry_.reset();
  reaper_.reset();
  peer_.reset();
}

// Shutdown lets the io_context run dry instead of stopping it: every session leaves its job
// and releases its segments on the io thread, before the registry and the pool go away.
// SIGTERM: no new jobs; the operations already submitted get up to --drain-timeout-ms to finish
// (each job is through once it completed as many operations as were done or pending at the
// signal); then stop() fails what is left and the daemon exits.
void Daemon::drain() {
  // The drain may outlast the unit's TimeoutStopSec: ask systemd for the time it needs.
  systemd_.notify("STOPPING=1\nSTATUS=draining\nEXTEND_TIMEOUT_USEC=" +
                  std::to_string((config_.drain_timeout + std::chrono::seconds(10)).count() * 1000));
  stopping_ = true;
  registry_->refuse_joins(Status::aborted("gradsyncd is shutting down"));
  std::map<std::pair<uid_t, std::string>, uint64_t> targets;
  for (const auto& job : registry_->jobs()) {
    const admin::JobInfo info = job->info();
    if (info.state == "running" && info.operations_pending > 0) {
      targets[{info.uid, info.id}] = info.operations_done + info.operations_pending;
    }
  }
  drain_started_ = std::chrono::steady_clock::now();
  drain_check(std::move(targets), drain_started_ + config_.drain_timeout);
}

void Daemon::drain_check(std::map<std::pair<uid_t, std::string>, uint64_t> targets,
                         std::chrono::steady_clock::time_point deadline) {
  bool drained = true;
  // An operation written to a ring just before the signal reaches its worker within
  // microseconds; for the first 50 ms whatever becomes pending joins the targets.
  const bool settling = std::chrono::steady_clock::now() - drain_started_ < std::chrono::milliseconds(50);
  for (const auto& job : registry_->jobs()) {
    const admin::JobInfo info = job->info();
    if (settling && info.state == "running" && info.operations_pending > 0) {
      uint64_t& target = targets[{info.uid, info.id}];
      target = std::max(target, info.operations_done + info.operations_pending);
    }
    auto it = targets.find({info.uid, info.id});
    if (it != targets.end() && info.state == "running" && info.operations_done < it->second) drained = false;
  }
  if ((drained && !settling) || std::chrono::steady_clock::now() >= deadline) {
    log_.info(drained ? "drained: every operation submitted before the signal finished"
                      : "drain timed out: failing what is left");
    stop();
    return;
  }
  drain_timer_.expires_after(std::chrono::milliseconds(10));
  drain_timer_.async_wait([this, targets = std::move(targets), deadline](const boost::system::error_code& ec) mutable {
    if (!ec) drain_check(std::move(targets), deadline);
  });
}

void Daemon::wait_for_reload() {
  reload_signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    reload();
    wait_for_reload();
  });
}

// On the io thread. Applies the log level, the job bounds (for new jobs) and the allowed users
// (for new connections); anything else needs a restart, and says so. An invalid configuration
// changes nothing.
void Daemon::reload() {
  if (!reparse_) {
    log_.warning("SIGHUP: this gradsyncd cannot reload its configuration; ignored");
    return;
  }
  ParsedConfig parsed = reparse_();
  if (!parsed.config) {
    log_.error("SIGHUP: the configuration was rejected, the old one stays in effect: " + parsed.message);
    return;
  }
  const DaemonConfig& next = *parsed.config;
  // Each setting as declared (config/settings.cc): a live one takes the new value, one that
  // needs a restart keeps its running value, so that status shows what is in effect.
  std::vector<std::string> changed, need_restart;
  for (const SettingSpec& setting : daemon_settings()) {
    if (setting.text(next) == setting.text(config_)) continue;
    if (setting.reload == Reload::kLive) {
      setting.copy(next, &config_);
      changed.push_back(setting.name);
    } else {
      need_restart.push_back(setting.name);
    }
  }
  log_.set_level(config_.log_level);
  registry_->set_timeouts(config_.default_timeout, config_.max_timeout, config_.execution_timeout);
  server_->set_allowed_uids(config_.allowed_uids);
  if (admin_) admin_->set_others_allowed(!config_.allowed_uids.empty());
  if (admin_view_) admin_view_->set_config(config_);
  std::string text;
  for (const auto& c : changed) text += (text.empty() ? "" : ", ") + c;
  log_.info("SIGHUP: configuration reloaded" + (text.empty() ? std::string(", nothing changed") : "; applied: " + text +
                                                                                   " (the bounds apply to new jobs, "
                                                                                   "allow-uid to new connections)"));
  for (const auto& name : need_restart) {
    log_.warning("SIGHUP: " + name + " changed in the configuration; it takes effect when gradsyncd restarts");
  }
}

void Daemon::ping_watchdog() {
  systemd_.notify("WATCHDOG=1");
  watchdog_timer_.expires_after(*systemd_.watchdog_period());
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) ping_watchdog();
  });
}

void Daemon::gpu_lost(int device, const Status& why) {
  // Any thread: the executor that met the error. The jobs on that GPU have failed already; the
  // rest drain as at SIGTERM, and the exit status asks systemd for a restart.
  boost::asio::post(io_, [this, device, why] {
    if (exit_code_ != 0) return;
    exit_code_ = kExitGpuLost;
    log_.error("GPU " + std::to_string(device) + ": " + why.message() + ". gradsyncd drains and exits with status " +
               std::to_string(kExitGpuLost) + " so that systemd restarts it (Restart=on-failure)");
    // The drain and the stop must not hang on the broken context (a job's teardown aborts its
    // NCCL communicators there): past the drain's bound and 10 s more, the process ends as it
    // is. Detached on purpose: it outlives everything, and ends the process.
    const auto bound = config_.drain_timeout + std::chrono::seconds(10);
    std::thread([bound] {
      std::this_thread::sleep_for(bound);
      std::fflush(stderr);
      std::_Exit(kExitGpuLost);
    }).detach();
    if (!stopping_) drain();
  });
}

void Daemon::stop() {
  if (!stopping_) systemd_.notify("STOPPING=1");
  stopping_ = true;
  if (stopped_) return;
  stopped_ = true;
  drain_timer_.cancel();
  watchdog_timer_.cancel();
  boost::system::error_code ignored;
  reload_signals_.cancel(ignored);
  // A stop that no signal began (a lost GPU) still has the stop signals' wait pending, which
  // would keep io_.run() from returning; back to their default disposition too.
  signals_.cancel(ignored);
  signals_.clear(ignored);
  const Status why = Status::aborted("gradsyncd is shutting down");
  registry_->fail_all(why);
  server_->stop(why);
}

int Daemon::run() {
  signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    log_.info(std::string("received ") + (signal == SIGTERM ? "SIGTERM" : "SIGINT") + ", draining for up to " +
              std::to_string(config_.drain_timeout.count()) +
              " ms, then shutting down (a second SIGTERM or SIGINT exits at once)");
    // Back to the default disposition: should a shutdown ever hang, the operator's second
    // signal ends the process rather than being swallowed.
    boost::system::error_code ignored;
    signals_.clear(ignored);
    drain();
  });
  server_->start();
  wait_for_reload();
  log_.info(std::string("gradsyncd ") + kGradsyncVersion + " ready (" + std::to_string(pool_.size()) +
            " reduce threads, default timeout " + std::to_string(config_.default_timeout.count()) + " ms)");
  // Every socket listens now (control, admin, peer service).
  systemd_.notify("READY=1\nSTATUS=serving on " + config_.socket_path + "\nMAINPID=" + std::to_string(::getpid()));
  if (systemd_.watchdog_period()) ping_watchdog();
  arm_test_hooks();
  io_.run();
  return exit_code_;
}

void Daemon::arm_test_hooks() {
  // Acts as if a sticky CUDA error broke GPU 0 (the daemon's side of it: the drain and exit
  // status 75), on machines without a GPU.
  if (hooks_.gpu_lost_after) {
    auto timer = std::make_shared<boost::asio::steady_timer>(io_, *hooks_.gpu_lost_after);
    timer->async_wait([timer, this](const boost::system::error_code& ec) {
      if (ec) return;
      log_.warning("GRADSYNCD_TEST_GPU_LOST_AFTER_MS: reporting GPU 0 lost (a test hook)");
      gpu_lost(0, Status::internal("GPU 0 is unusable: a test said so"));
    });
  }
  // Blocks the io thread, so a test sees the watchdog pings stop (what makes systemd restart a
  // hung daemon).
  if (hooks_.hang_io_after) {
    auto timer = std::make_shared<boost::asio::steady_timer>(io_, *hooks_.hang_io_after);
    timer->async_wait([timer, this](const boost::system::error_code& ec) {
      if (ec) return;
      log_.warning("GRADSYNCD_TEST_HANG_IO_AFTER_MS: blocking the io thread for good (a test hook)");
      for (;;) ::pause();
    });
  }
}

}  // namespace gradsync
