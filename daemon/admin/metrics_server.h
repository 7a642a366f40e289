// Prometheus metrics over HTTP (Boost.Beast), off by default (--metrics HOST:PORT): GET /metrics
// answers in the text exposition format, from the same snapshots as the admin service
// (view.h), so a scrape never touches live state off its owning thread. One thread accepts and
// reads each request's head (asynchronously, at most kMaxReading at once, each cut at
// kReadDeadline however slowly it trickles in); each request read is answered on a handler
// thread of its own (at most kMaxHandlers), whose write is bounded too. So a slow, idle or
// slowloris client holds neither the endpoint, a thread, nor the daemon. Every job's series
// carry job and uid labels; scrapers reach them all, so bind it to an address only the
// monitoring system reaches.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/control/asio.h"

#include "daemon/admin/view.h"
#include "daemon/job/daemon_counters.h"
#include "daemon/util/log.h"
#include "shared/mutex.h"

namespace gradsync::admin {

struct MetricsServerOptions {
  std::string address;  // "HOST:PORT"; port 0 picks one (port() says which)
  DaemonView* view = nullptr;              // outlives the server
  const DaemonCounters* failures = nullptr;  // outlives the server
  Logger log;
};

// The exposition text for one scrape.
std::string render_metrics(const DaemonStatus& status, const std::vector<JobStatistics>& jobs,
                           const std::vector<ClientInfo>& clients, const DaemonCounters& failures);

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
  struct Handler {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  static constexpr size_t kMaxHandlers = 4;
  static constexpr size_t kMaxReading = 64;
  static constexpr size_t kMaxHead = 16 * 1024;
  static constexpr std::chrono::seconds kReadDeadline{2};
  struct Request {
    bool get = false;
    std::string target;
    unsigned version = 11;
  };
  void serve();
  boost::asio::awaitable<void> read_request(boost::asio::ip::tcp::socket socket);  // on the server's thread
  void handle(int fd, const Request& request);  // one connection, on its handler thread
  std::string scrape();

  MetricsServerOptions options_;
  std::unique_ptr<State> state_;  // the io_context and acceptor
  int port_ = 0;
  Mutex handlers_mutex_;
  std::vector<Handler> handlers_ GS_GUARDED_BY(handlers_mutex_);  // joined when done or at the end
  size_t reading_ = 0;             // requests being read; the server's thread only
  std::thread thread_;
};

}  // namespace gradsync::admin
