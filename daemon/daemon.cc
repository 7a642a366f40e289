#include "daemon/daemon.h"

#include <csignal>

#include "shared/version.h"

namespace gradsync {

Daemon::Daemon(DaemonConfig config)
    : config_(std::move(config)),
      log_(config_.log_level),
      signals_(io_, SIGINT, SIGTERM),
      pool_(config_.reduce_threads),
      registry_(RegistryOptions{&io_, &pool_, log_, config_.default_timeout, config_.max_timeout}) {
  // A client that vanishes mid-write must not kill the daemon.
  std::signal(SIGPIPE, SIG_IGN);
  server_ = std::make_unique<ControlServer>(
      io_, ControlServerOptions{config_.socket_path, config_.allowed_uids, &registry_, log_});
}

Daemon::~Daemon() {
  stop();
  // Whatever is still queued (a session that was mid-shutdown) completes before the registry,
  // the pool and the io_context are destroyed.
  io_.restart();
  io_.run_for(std::chrono::seconds(5));
  server_.reset();
}

// Shutdown lets the io_context run dry instead of stopping it: every session leaves its job
// and releases its segments on the io thread, before the registry and the pool go away.
void Daemon::stop() {
  registry_.fail_all(Status::aborted("gradsyncd is shutting down"));
  server_->stop();
}

int Daemon::run() {
  signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    log_.info(std::string("received ") + (signal == SIGTERM ? "SIGTERM" : "SIGINT") + ", shutting down");
    stop();
  });
  server_->start();
  log_.info(std::string("gradsyncd ") + kGradsyncVersion + " ready (" + std::to_string(pool_.size()) +
            " reduce threads, default timeout " + std::to_string(config_.default_timeout.count()) + " ms)");
  io_.run();
  return 0;
}

}  // namespace gradsync
