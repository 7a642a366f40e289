#include "daemon/admin/metrics_server.h"

#include "daemon/control/asio.h"  // Asio with coroutines (Boost 1.74 needs <utility> first)

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdio>
#include <sstream>

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

}  // namespace

std::string render_metrics(const DaemonStatus& status, const std::vector<JobStatistics>& jobs,
                           const std::vector<ClientInfo>& clients, const FailureCounts& failures) {
  std::ostringstream out;
  out << "# HELP gradsync_build_info The running gradsyncd's version.\n# TYPE gradsync_build_info gauge\n"
      << "gradsync_build_info{version=\"" << status.version << "\"} 1\n";
  out << "# HELP gradsync_uptime_seconds Time since gradsyncd started.\n# TYPE gradsync_uptime_seconds gauge\n"
      << "gradsync_uptime_seconds " << number(std::chrono::duration<double>(status.uptime).count()) << "\n";
  out << "# HELP gradsync_jobs Jobs on this daemon.\n# TYPE gradsync_jobs gauge\ngradsync_jobs " << jobs.size() << "\n";
  out << "# HELP gradsync_clients Connected trainers.\n# TYPE gradsync_clients gauge\ngradsync_clients "
      << clients.size() << "\n";
  out << "# HELP gradsync_job_failures_total Jobs that ended with an error, by its code.\n"
      << "# TYPE gradsync_job_failures_total counter\n";
  for (size_t c = 1; c < FailureCounts::kCodes; ++c) {
    const auto code = static_cast<ErrorCode>(c);
    out << "gradsync_job_failures_total{code=\"" << error_code_name(code) << "\"} " << failures.count(code) << "\n";
  }
  const auto labels = [](const JobStatistics& j) {
    return "job=\"" + j.job.id + "\",uid=\"" + std::to_string(j.job.uid) + "\"";
  };
  out << "# HELP gradsync_operations_total Operations every local rank saw complete.\n"
      << "# TYPE gradsync_operations_total counter\n";
  for (const auto& j : jobs) out << "gradsync_operations_total{" << labels(j) << "} " << j.stats.operations << "\n";
  out << "# HELP gradsync_reduced_bytes_total Bucket bytes reduced (one rank's share).\n"
      << "# TYPE gradsync_reduced_bytes_total counter\n";
  for (const auto& j : jobs) out << "gradsync_reduced_bytes_total{" << labels(j) << "} " << j.stats.bytes << "\n";
  out << "# HELP gradsync_operations_pending Operations submitted and not finished (queue depth).\n"
      << "# TYPE gradsync_operations_pending gauge\n";
  for (const auto& j : jobs) {
    out << "gradsync_operations_pending{" << labels(j) << "} " << j.job.operations_pending << "\n";
  }
  out << "# HELP gradsync_operation_duration_seconds From an operation's first submission to its completion.\n"
      << "# TYPE gradsync_operation_duration_seconds histogram\n";
  for (const auto& j : jobs) histogram(out, "gradsync_operation_duration_seconds", labels(j), j.stats.operation_latency);
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
  const auto colon = options_.address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw Error(Status::invalid_argument("--metrics must be HOST:PORT, not '" + options_.address + "'"));
  }
  boost::system::error_code ec;
  const auto host = asio::ip::make_address(options_.address.substr(0, colon), ec);
  if (ec) throw Error(Status::invalid_argument("--metrics: '" + options_.address + "': " + ec.message()));
  const int port = std::atoi(options_.address.substr(colon + 1).c_str());
  const asio::ip::tcp::endpoint endpoint(host, static_cast<unsigned short>(port));
  state_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) state_->acceptor.bind(endpoint, ec);
  if (!ec) state_->acceptor.listen(16, ec);
  if (ec) throw Error(Status::internal("--metrics " + options_.address + ": " + ec.message()));
  port_ = state_->acceptor.local_endpoint().port();
  options_.log.info("metrics on http://" + options_.address.substr(0, colon) + ":" + std::to_string(port_) +
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
}

std::string MetricsServer::scrape() {
  DaemonStatus status;
  std::vector<JobStatistics> jobs;
  std::vector<ClientInfo> clients;
  if (!options_.view->status(&status).ok() || !options_.view->stats("", &jobs).ok() ||
      !options_.view->clients(&clients).ok()) {
    return {};  // the daemon did not answer in time: the scrape fails, which is the signal
  }
  return render_metrics(status, jobs, clients, *options_.failures);
}

// One connection at a time, each with a deadline: a scrape is small, and Prometheus scrapes
// seldom; a client that dawdles loses its connection, not the daemon's time.
void MetricsServer::serve() {
  asio::co_spawn(
      state_->io,
      [this]() -> asio::awaitable<void> {
        for (;;) {
          boost::system::error_code ec;
          asio::ip::tcp::socket socket =
              co_await state_->acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
          if (ec) {
            if (!state_->acceptor.is_open()) co_return;
            continue;
          }
          beast::tcp_stream stream(std::move(socket));
          stream.expires_after(std::chrono::seconds(5));
          beast::flat_buffer buffer;
          http::request<http::string_body> request;
          boost::system::error_code read_error;
          co_await http::async_read(stream, buffer, request, asio::redirect_error(asio::use_awaitable, read_error));
          if (read_error) continue;
          http::response<http::string_body> response;
          response.version(request.version());
          response.keep_alive(false);
          if (request.method() != http::verb::get || request.target() != "/metrics") {
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
          boost::system::error_code write_error;
          co_await http::async_write(stream, response, asio::redirect_error(asio::use_awaitable, write_error));
          beast::error_code ignored;
          stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        }
      },
      asio::detached);
  state_->io.run();
}

}  // namespace gradsync::admin
