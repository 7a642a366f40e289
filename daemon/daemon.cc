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
  server_.reset();
  registry_.fail_all(Status::aborted("gradsyncd is shutting down"));
}

void Daemon::stop() {
  server_->stop();
  registry_.fail_all(Status::aborted("gradsyncd is shutting down"));
  io_.stop();
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
