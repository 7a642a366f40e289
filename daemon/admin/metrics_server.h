// Prometheus metrics over HTTP (Boost.Beast), off by default (--metrics HOST:PORT): GET /metrics
// answers in the text exposition format, from the same snapshots as the admin service
// (view.h), so a scrape never touches live state off its owning thread. One thread serves
// connections one at a time, each bounded by a short timeout, so a slow scraper cannot hold
// the daemon. Every job's series carry job and uid labels; scrapers reach them all, so bind
// it to an address only the monitoring system reaches.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "daemon/admin/view.h"
#include "daemon/job/failure_counts.h"
#include "daemon/util/log.h"

namespace gradsync::admin {

struct MetricsServerOptions {
  std::string address;  // "HOST:PORT"; port 0 picks one (port() says which)
  DaemonView* view = nullptr;              // outlives the server
  const FailureCounts* failures = nullptr;  // outlives the server
  Logger log;
};

// The exposition text for one scrape.
std::string render_metrics(const DaemonStatus& status, const std::vector<JobStatistics>& jobs,
                           const std::vector<ClientInfo>& clients, const FailureCounts& failures);

class MetricsServer {
 public:
  // Binds and starts serving; throws Error naming the address when it cannot.
  explicit MetricsServer(MetricsServerOptions options);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  struct State;
  void serve();
  std::string scrape();

  MetricsServerOptions options_;
  std::unique_ptr<State> state_;  // the io_context and acceptor (Beast stays out of this header)
  int port_ = 0;
  std::thread thread_;
};

}  // namespace gradsync::admin
