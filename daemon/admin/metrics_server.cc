#include "daemon/admin/metrics_server.h"

#include "daemon/control/asio.h"  // Asio with coroutines (Boost 1.74 needs <utility> first)

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "shared/host_port.h"

namespace gradsync::admin {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

// One histogram's _bucket (cumulative), _sum and _count lines.
void histogram(std::ostringstream& out, const std::string& name, const std::string& labels, const Histogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < Histogram::kBoundsSeconds.size(); ++i) {
    cumulative += h.counts()[i];
    const std::string le = i + 1 == Histogram::kBoundsSeconds.size() ? "+Inf" : number(Histogram::kBoundsSeconds[i]);
    out << name << "_bucket{" << labels << ",le=\"" << le << "\"} " << cumulative << "\n";
  }
  out << name << "_sum{" << labels << "} " << number(h.sum_seconds()) << "\n";
  out << name << "_count{" << labels << "} " << h.count() << "\n";
}

// The standard process_* metrics of Prometheus' client libraries, from /proc/self.
void process_metrics(std::ostringstream& out) {
  const long ticks = ::sysconf(_SC_CLK_TCK), page = ::sysconf(_SC_PAGESIZE);
  // Any surprise in /proc (out of descriptors, an odd kernel) leaves these lines out rather
  // than failing the whole scrape.
  try {
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    const size_t command_end = stat.rfind(')');
    // Fields after the command (which may hold spaces), from field 3 on.
    std::istringstream fields(command_end == std::string::npos ? std::string() : stat.substr(command_end + 1));
    std::vector<std::string> f((std::istream_iterator<std::string>(fields)), std::istream_iterator<std::string>());
    if (f.size() > 21 && ticks > 0) {
      const double cpu = (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(ticks);  // utime + stime
      const double vsize = std::stod(f[20]), rss = std::stod(f[21]) * static_cast<double>(page);
      double boot = 0;
      std::ifstream stat_all("/proc/stat");
      for (std::string line; std::getline(stat_all, line);) {
        if (line.rfind("btime ", 0) == 0) boot = std::stod(line.substr(6));
      }
      const double start = boot + std::stod(f[19]) / static_cast<double>(ticks);
      out << "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
          << "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total " << number(cpu) << "\n"
          << "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
          << "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes " << number(vsize) << "\n"
          << "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
          << "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes " << number(rss) << "\n"
          << "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
          << "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds " << number(start) << "\n";
    }
  } catch (const std::exception&) {
  }
  size_t open = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++open;
  }
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  out << "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\n"
      << "process_open_fds " << open << "\n"
      << "# HELP process_max_fds Maximum number of open file descriptors.\n# TYPE process_max_fds gauge\n"
      << "process_max_fds " << number(static_cast<double>(limit.rlim_cur)) << "\n";
}

}  // namespace

std::string render_metrics(const DaemonStatus& status, const std::vector<JobStatistics>& jobs,
                           const std::vector<ClientInfo>& clients, const DaemonCounters& failures) {
  std::ostringstream out;
  out << "# HELP gradsync_build_info The running gradsyncd's version.\n# TYPE gradsync_build_info gauge\n"
      << "gradsync_build_info{version=\"" << status.version << "\"} 1\n";
  out << "# HELP gradsync_uptime_seconds Time since gradsyncd started.\n# TYPE gradsync_uptime_seconds gauge\n"
      << "gradsync_uptime_seconds " << number(std::chrono::duration<double>(status.uptime).count()) << "\n";
  out << "# HELP gradsync_peer_calls_total Calls this daemon's peer service received, by method (at the "
         "rendezvous: the store traffic of formation, failure notices and probes).\n"
         "# TYPE gradsync_peer_calls_total counter\n";
  for (const auto& [method, count] : status.peer_calls) {
    out << "gradsync_peer_calls_total{method=\"" << method << "\"} " << count << "\n";
  }
  out << "# HELP gradsync_peer_get_bytes_total Bytes of the values this daemon's peer service answered Get "
         "calls with (at the rendezvous: what formation reads).\n"
         "# TYPE gradsync_peer_get_bytes_total counter\ngradsync_peer_get_bytes_total "
      << status.peer_get_bytes << "\n";
  out << "# HELP gradsync_jobs Jobs on this daemon.\n# TYPE gradsync_jobs gauge\ngradsync_jobs " << jobs.size() << "\n";
  out << "# HELP gradsync_clients Connected trainers.\n# TYPE gradsync_clients gauge\ngradsync_clients "
      << clients.size() << "\n";
  out << "# HELP gradsync_job_failures_total Jobs that ended with an error, by its code.\n"
      << "# TYPE gradsync_job_failures_total counter\n";
  for (size_t c = 1; c < DaemonCounters::kCodes; ++c) {
    const auto code = static_cast<ErrorCode>(c);
    out << "gradsync_job_failures_total{code=\"" << error_code_name(code) << "\"} " << failures.count(code) << "\n";
  }
  // Daemon-wide, surviving the end of the jobs they count: what to alert on.
  uint64_t operations = failures.ended_operations(), bytes = failures.ended_bytes();
  uint64_t carried = failures.ended_cross_node_bytes();
  for (const auto& j : jobs) {
    operations += j.stats.operations;
    bytes += j.stats.bytes;
    carried += j.stats.cross_node_bytes;
  }
  out << "# HELP gradsync_daemon_operations_total Operations completed by every job since gradsyncd started.\n"
      << "# TYPE gradsync_daemon_operations_total counter\ngradsync_daemon_operations_total " << operations << "\n";
  out << "# HELP gradsync_daemon_reduced_bytes_total Bucket bytes reduced (one rank's share) by every job since "
         "gradsyncd started.\n# TYPE gradsync_daemon_reduced_bytes_total counter\n"
      << "gradsync_daemon_reduced_bytes_total " << bytes << "\n";
  out << "# HELP gradsync_daemon_cross_node_bytes_total Payload bytes every job handed to cross-node collectives "
         "since gradsyncd started (a masked set's kept elements only, half with wire compression).\n"
         "# TYPE gradsync_daemon_cross_node_bytes_total counter\n"
      << "gradsync_daemon_cross_node_bytes_total " << carried << "\n";
  out << "# HELP gradsync_jobs_ended_total Jobs that ended: cleanly (every rank left between operations) or "
         "failed (work was pending).\n# TYPE gradsync_jobs_ended_total counter\n"
      << "gradsync_jobs_ended_total{how=\"clean\"} " << failures.clean_jobs() << "\n"
      << "gradsync_jobs_ended_total{how=\"failed\"} " << failures.failed_jobs() << "\n";
  process_metrics(out);
  const auto labels = [](const JobStatistics& j) {
    return "job=\"" + j.job.id + "\",uid=\"" + std::to_string(j.job.uid) + "\"";
  };
  out << "# HELP gradsync_operations_total Operations every local rank saw complete.\n"
      << "# TYPE gradsync_operations_total counter\n";
  for (const auto& j : jobs) out << "gradsync_operations_total{" << labels(j) << "} " << j.stats.operations << "\n";
  out << "# HELP gradsync_reduced_bytes_total Bucket bytes reduced (one rank's share).\n"
      << "# TYPE gradsync_reduced_bytes_total counter\n";
  for (const auto& j : jobs) out << "gradsync_reduced_bytes_total{" << labels(j) << "} " << j.stats.bytes << "\n";
  out << "# HELP gradsync_cross_node_bytes_total Payload bytes this node handed to cross-node collectives (a masked "
         "set's kept elements only, half with wire compression).\n"
      << "# TYPE gradsync_cross_node_bytes_total counter\n";
  for (const auto& j : jobs) {
    out << "gradsync_cross_node_bytes_total{" << labels(j) << "} " << j.stats.cross_node_bytes << "\n";
  }
  out << "# HELP gradsync_operations_pending Operations submitted and not finished (queue depth).\n"
      << "# TYPE gradsync_operations_pending gauge\n";
  for (const auto& j : jobs) {
    out << "gradsync_operations_pending{" << labels(j) << "} " << j.job.operations_pending << "\n";
  }
  out << "# HELP gradsync_operation_duration_seconds From an operation's first submission to its completion.\n"
      << "# TYPE gradsync_operation_duration_seconds histogram\n";
  for (const auto& j : jobs) histogram(out, "gradsync_operation_duration_seconds", labels(j), j.stats.operation_latency);
  const std::pair<const char*, Histogram JobStatsSnapshot::*> parts[] = {
      {"gradsync_bucket_wait_for_ranks_seconds", &JobStatsSnapshot::waiting_for_ranks},
      {"gradsync_bucket_execution_seconds", &JobStatsSnapshot::executing},
      {"gradsync_bucket_wait_for_peers_seconds", &JobStatsSnapshot::waiting_for_peers},
      {"gradsync_bucket_local_reduction_seconds", &JobStatsSnapshot::local_reduction},
      {"gradsync_bucket_collective_seconds", &JobStatsSnapshot::collective}};
  const char* const helps[] = {
      "Per bucket: from the previous step of its operation until every local rank made it ready.",
      "Per bucket: from launch to landing (local reduction, the collective across nodes, fan-out).",
      "Per cross-node bucket: until every node reached it.",
      "Per bucket: combining, scaling and fan-out on this node.",
      "Per cross-node bucket: the engine's collective."};
  for (size_t p = 0; p < std::size(parts); ++p) {
    out << "# HELP " << parts[p].first << " " << helps[p] << "\n# TYPE " << parts[p].first << " histogram\n";
    for (const auto& j : jobs) histogram(out, parts[p].first, labels(j), j.stats.*(parts[p].second));
  }
  out << "# HELP gradsync_readiness_lag_seconds How long after a job's first local rank each rank made a bucket "
         "ready.\n# TYPE gradsync_readiness_lag_seconds histogram\n";
  for (const auto& j : jobs) {
    for (size_t r = 0; r < j.stats.readiness_lag.size(); ++r) {
      const int rank = j.job.node * j.job.local_world_size + static_cast<int>(r);
      histogram(out, "gradsync_readiness_lag_seconds", labels(j) + ",rank=\"" + std::to_string(rank) + "\"",
                j.stats.readiness_lag[r]);
    }
  }
  return out.str();
}

struct MetricsServer::State {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor{io};
};

MetricsServer::MetricsServer(MetricsServerOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {
  HostPort address;
  if (std::string why; !parse_host_port(options_.address, &address, &why)) {
    throw Error(Status::invalid_argument("--metrics must be HOST:PORT, not '" + options_.address + "': " + why));
  }
  boost::system::error_code ec;
  const auto host = asio::ip::make_address(address.host, ec);
  if (ec) throw Error(Status::invalid_argument("--metrics: '" + options_.address + "': " + ec.message()));
  const asio::ip::tcp::endpoint endpoint(host, address.port);
  state_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) state_->acceptor.bind(endpoint, ec);
  if (!ec) state_->acceptor.listen(16, ec);
  if (ec) throw Error(Status::internal("--metrics " + options_.address + ": " + ec.message()));
  port_ = state_->acceptor.local_endpoint().port();
  options_.log.info("metrics on http://" + address.host_text() + ":" + std::to_string(port_) +
                    "/metrics");
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  asio::post(state_->io, [this] {
    boost::system::error_code e;
    state_->acceptor.close(e);
  });
  state_->io.stop();
  if (thread_.joinable()) thread_.join();
  // Each handler ends within its timeouts and one scrape (a few seconds at most).
  MutexLock lock(handlers_mutex_);
  for (Handler& h : handlers_) h.thread.join();
}

std::string MetricsServer::scrape() {
  DaemonStatus status;
  std::vector<JobStatistics> jobs;
  std::vector<ClientInfo> clients;
  if (!options_.view->status(&status).ok() || !options_.view->stats("", std::nullopt, &jobs).ok() ||
      !options_.view->clients(&clients).ok()) {
    return {};  // the daemon did not answer in time: the scrape fails, which is the signal
  }
  return render_metrics(status, jobs, clients, *options_.failures);
}

namespace {

// A scrape's answer is written within this, however slowly the client reads; each send waits
// at most the socket's send timeout. (The handler works on the plain descriptor.)
constexpr auto kWriteDeadline = std::chrono::seconds(5);

void write_all(int fd, const std::string& bytes) {
  timeval write_timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &write_timeout, sizeof write_timeout);
  const auto deadline = std::chrono::steady_clock::now() + kWriteDeadline;
  size_t sent = 0;
  while (sent < bytes.size() && std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace

void MetricsServer::handle(int fd, const Request& request) {
  try {
    http::response<http::string_body> response;
    response.version(request.version);
    response.keep_alive(false);
    if (!request.get || request.target != "/metrics") {
      response.result(http::status::not_found);
      response.set(http::field::content_type, "text/plain");
      response.body() = "gradsyncd serves /metrics only\n";
    } else if (std::string body = scrape(); body.empty()) {
      response.result(http::status::service_unavailable);
      response.set(http::field::content_type, "text/plain");
      response.body() = "gradsyncd did not answer within 2 s (busy, or hung)\n";
    } else {
      response.result(http::status::ok);
      response.set(http::field::content_type, "text/plain; version=0.0.4");
      response.body() = std::move(body);
    }
    response.prepare_payload();
    std::ostringstream wire;
    wire << response;
    write_all(fd, wire.str());
  } catch (const std::exception& e) {
    options_.log.warning(std::string("metrics: a scrape failed: ") + e.what());
  }
}

// On the server's thread: reads one request head within kReadDeadline, keeping the bytes the
// parser has not consumed yet (Beast parses a head only once it is whole, so a request that
// arrives a byte at a time is read whole), then hands the connection to a scrape handler.
// Reading holds no thread, so slow clients (slowloris) cost a coroutine each, at most
// kMaxReading of them, and each is cut at the deadline however it trickles.
asio::awaitable<void> MetricsServer::read_request(asio::ip::tcp::socket accepted) {
  // Shared with the deadline's handler, which may already be queued when the read completes:
  // it must find a live socket (closing one that was handed over is harmless), never a frame
  // that is gone.
  auto owned = std::make_shared<asio::ip::tcp::socket>(std::move(accepted));
  asio::ip::tcp::socket& socket = *owned;
  struct Count {  // on the server's thread only
    size_t& n;
    explicit Count(size_t& n) : n(++n) {}
    ~Count() { --n; }
  } counted(reading_);
  asio::steady_timer deadline(state_->io);
  deadline.expires_after(kReadDeadline);
  deadline.async_wait([owned](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled: the request was read (or the coroutine ended) in time
    boost::system::error_code ignored;
    owned->close(ignored);
  });
  http::request_parser<http::empty_body> parser;
  parser.eager(true);
  std::string pending;  // received, not yet consumed by the parser
  char buffer[4096];
  while (!parser.is_header_done()) {
    boost::system::error_code ec;
    const size_t n = co_await socket.async_read_some(asio::buffer(buffer), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;  // closed, failed, or cut at the deadline
    pending.append(buffer, n);
    if (pending.size() > kMaxHead) co_return;  // a request head is small
    for (;;) {
      beast::error_code parse_error;
      const size_t used = parser.put(asio::buffer(pending), parse_error);
      pending.erase(0, used);
      if (parse_error == http::error::need_more || (!parse_error && used == 0) || parser.is_header_done()) break;
      if (parse_error) co_return;
    }
  }
  deadline.cancel();
  Request request{parser.get().method() == http::verb::get, std::string(parser.get().target()),
                  parser.get().version()};
  MutexLock lock(handlers_mutex_);
  std::erase_if(handlers_, [](Handler& h) {
    if (!h.done->load()) return false;
    h.thread.join();
    return true;
  });
  if (handlers_.size() >= kMaxHandlers) co_return;  // the socket closes as it goes
  // The handler owns a plain descriptor, in blocking mode.
  const int fd = ::dup(socket.native_handle());
  boost::system::error_code ignored;
  socket.close(ignored);
  if (fd < 0) co_return;
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  auto done = std::make_shared<std::atomic<bool>>(false);
  handlers_.push_back(Handler{std::thread([this, done, fd, request = std::move(request)] {
                                handle(fd, request);
                                ::close(fd);
                                done->store(true);
                              }),
                              done});
}

// Accepts on the server's thread; each connection's request is read there (read_request), at
// most kMaxReading at once (more are closed at once), and answered on a handler thread of its
// own, at most kMaxHandlers at once: a slow client holds no thread while it sends, and a
// scrape blocked on a busy daemon holds no accept.
void MetricsServer::serve() {
  asio::co_spawn(
      state_->io,
      [this]() -> asio::awaitable<void> {
        asio::steady_timer pause(state_->io);
        while (state_->acceptor.is_open()) {
          boost::system::error_code ec;
          asio::ip::tcp::socket socket =
              co_await state_->acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
          if (ec) {
            if (!state_->acceptor.is_open()) co_return;
            // Out of descriptors, most likely: retrying at once would spin.
            pause.expires_after(std::chrono::milliseconds(100));
            co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            continue;
          }
          if (reading_ >= kMaxReading) continue;  // the socket closes as it goes
          asio::co_spawn(state_->io, read_request(std::move(socket)), asio::detached);
        }
      },
      [this](std::exception_ptr failure) {
        if (!failure) return;
        try {
          std::rethrow_exception(failure);
        } catch (const std::exception& e) {
          options_.log.error(std::string("metrics: the endpoint stopped: ") + e.what());
        }
      });
  state_->io.run();
}

}  // namespace gradsync::admin
