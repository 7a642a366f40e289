// Prometheus metrics (--metrics HOST:PORT) from a live daemon with real trainers: the gauges,
// per-job counters and histograms in the text exposition format, failures by code once a
// trainer is killed, and 404 for anything but /metrics.
#include <catch2/catch.hpp>
#include <filesystem>
#include <system_error>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/harness.h"

namespace gradsync::test {
namespace {

using namespace std::chrono_literals;

std::string shell(const std::string& command) { return run_command(command).output; }

// The port the daemon logged ("metrics on http://127.0.0.1:PORT/metrics").
std::string metrics_url(const TestDaemon& daemon) {
  std::smatch match;
  for (int i = 0; i < 100; ++i) {
    const std::string log = daemon.log();
    if (std::regex_search(log, match, std::regex(R"(metrics on (http://127\.0\.0\.1:\d+)/metrics)"))) {
      return match[1].str();
    }
    std::this_thread::sleep_for(20ms);
  }
  FAIL("the daemon never logged its metrics address");
  return {};
}

// A TCP connection to the metrics port on loopback.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  return fd;
}

}  // namespace

TEST_CASE("metrics: a bad --metrics address is refused, naming it", "[integration][metrics]") {
  for (const std::string& address : {std::string("127.0.0.1:70000"), std::string("127.0.0.1:abc"),
                                     std::string("nonsense"), std::string("999.1.1.1:80")}) {
    const std::string folder = "/tmp/gradsync-metrics-bad-" + std::to_string(::getpid());
    const CommandRun run = run_command(std::string(GRADSYNCD_BINARY) + " --socket " + folder +
                                       "/gradsync.sock --admin none --peer-listen 127.0.0.1:0" + " --metrics " + address);
    INFO(run.output);
    // The daemon made the folder for its socket, and removes it when it cannot start.
    CHECK_FALSE(std::filesystem::exists(folder));
    std::error_code ignored;
    std::filesystem::remove_all(folder, ignored);
    // Not HOST:PORT: a usage error as the flags are read (2); an address that is, but cannot be
    // bound, once the daemon tries (1).
    CHECK(run.code == (address == "999.1.1.1:80" ? 1 : 2));
    CHECK_THAT(run.output, Catch::Contains("--metrics"));
  }
}

TEST_CASE("metrics: gauges, per-job counters and histograms, and failures by code", "[integration][metrics]") {
  TestDaemon daemon({"--metrics", "127.0.0.1:0"});
  const std::string url = metrics_url(daemon);
  const std::string job = unique_job("metrics");
  Latch stepped;
  Latch end[2];
  ClientGroup group(2, [&](int rank) {
    auto client = join(daemon.socket(), job, rank, 2);
    const std::vector<TensorSpec> specs = {{DType::kFloat32, 1000}};
    const TensorSet set = client->register_tensors(client->allocate_flat(specs), {});
    for (int step = 0; step < 3; ++step) {
      if (!client->allreduce(set, ReduceOptions{}).wait(10s)) return fail("step timed out");
    }
    if (rank == 1) return end[rank].wait(60s) ? kOk : fail("never ended");
    // Rank 0 starts a step rank 1 never joins: the job has work pending when rank 1 dies.
    Work pending = client->allreduce(set, ReduceOptions{});
    stepped.open();
    try {
      pending.wait(30s);
    } catch (const Error&) {
    }
    return end[rank].wait(60s) ? kOk : fail("never ended");
  });
  REQUIRE(stepped.wait(30s));
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = shell("curl -s " + url + "/metrics");
    if (text.find("gradsync_operations_total{job=\"" + job + "\",uid=\"0\"} 3") != std::string::npos &&
        text.find("gradsync_operations_pending{job=\"" + job + "\",uid=\"0\"} 1") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  INFO(text);
  const std::string labels = "job=\"" + job + "\",uid=\"0\"";
  CHECK_THAT(text, Catch::Contains("# TYPE gradsync_jobs gauge\ngradsync_jobs 1\n") &&
                       Catch::Contains("gradsync_clients 2\n") &&
                       Catch::Contains("gradsync_operations_total{" + labels + "} 3\n") &&
                       Catch::Contains("gradsync_reduced_bytes_total{" + labels + "} 12000\n") &&
                       Catch::Contains("# TYPE gradsync_operation_duration_seconds histogram") &&
                       Catch::Contains("gradsync_operation_duration_seconds_bucket{" + labels + ",le=\"+Inf\"} 3\n") &&
                       Catch::Contains("gradsync_operation_duration_seconds_count{" + labels + "} 3\n") &&
                       Catch::Contains("gradsync_readiness_lag_seconds_count{" + labels + ",rank=\"1\"} 3\n") &&
                       Catch::Contains("gradsync_job_failures_total{code=\"PeerLost\"} 0\n"));
  // Histogram buckets are cumulative: never decreasing.
  std::regex bucket("gradsync_operation_duration_seconds_bucket\\{[^}]*\\} (\\d+)");
  uint64_t last = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), bucket); it != std::sregex_iterator(); ++it) {
    const uint64_t value = std::stoull((*it)[1].str());
    CHECK(value >= last);
    last = value;
  }
  // A trainer killed mid-step: the job fails with PeerLost, counted (a clean end would not be).
  group.signal(1, SIGKILL);
  end[0].open();
  for (int i = 0; i < 100; ++i) {
    text = shell("curl -s " + url + "/metrics");
    if (text.find("gradsync_job_failures_total{code=\"PeerLost\"} 1") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  CHECK_THAT(text, Catch::Contains("gradsync_job_failures_total{code=\"PeerLost\"} 1\n"));
  CHECK_THAT(shell("curl -s -o /dev/null -w '%{http_code}' " + url + "/other"), Catch::Equals("404"));
  group.wait_all(30s);

  // Idle connections that never send a request hold neither the endpoint nor the daemon.
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  std::vector<int> idle;
  for (int i = 0; i < 6; ++i) idle.push_back(connect_to(port));
  const auto asked = std::chrono::steady_clock::now();
  const std::string scraped = shell("curl -s --max-time 10 " + url + "/metrics");  // at once, no retry
  CHECK_THAT(scraped, Catch::Contains("gradsync_jobs "));
  CHECK(std::chrono::steady_clock::now() - asked < 5s);
  for (int fd : idle) ::close(fd);
}

namespace {

// Everything the server sends until it closes (or 5 s pass).
std::string read_all(int fd) {
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string text;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

}  // namespace

TEST_CASE("metrics: a request sent a byte at a time is read whole", "[integration][metrics]") {
  TestDaemon daemon({"--metrics", "127.0.0.1:0"});
  const std::string url = metrics_url(daemon);
  const int fd = connect_to(std::stoi(url.substr(url.rfind(':') + 1)));
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: scraper\r\nAccept: text/plain\r\n\r\n";
  for (char c : request) {
    REQUIRE(::send(fd, &c, 1, MSG_NOSIGNAL) == 1);
    std::this_thread::sleep_for(2ms);
  }
  const std::string reply = read_all(fd);
  ::close(fd);
  INFO(reply.substr(0, 200));
  CHECK(reply.rfind("HTTP/1.1 200 OK", 0) == 0);
  CHECK_THAT(reply, Catch::Contains("gradsync_uptime_seconds "));
}

// Slowloris: connections that send a header line every 0.8 s, as long as they are let, more of
// them than there are scrape handlers. Each is cut at the 2 s read deadline, and every scrape
// meanwhile is answered (with a 16 KiB head limit and a per-read timeout alone, four such
// connections closed every scrape for 40 s).
TEST_CASE("metrics: slow senders are cut at the read deadline and never keep a scrape out", "[integration][metrics]") {
  TestDaemon daemon({"--metrics", "127.0.0.1:0"});
  const std::string url = metrics_url(daemon);
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  std::atomic<bool> stop{false};
  std::atomic<int> cut_within_3s{0}, slow_connections{0};
  std::vector<std::thread> attackers;
  for (int a = 0; a < 16; ++a) {
    attackers.emplace_back([&] {
      while (!stop.load()) {
        const int fd = connect_to(port);
        ++slow_connections;
        const auto opened = std::chrono::steady_clock::now();
        std::string line = "GET /metrics HTTP/1.1\r\n";
        bool open = true;
        for (int i = 0; open && !stop.load() && i < 20; ++i) {
          open = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
          line = "X-Slow-" + std::to_string(i) + ": a\r\n";
          // Between lines, watch for the server's close.
          pollfd p{fd, POLLIN, 0};
          if (open && ::poll(&p, 1, 800) > 0) {
            char byte;
            open = ::recv(fd, &byte, 1, 0) > 0;
          }
        }
        if (!open && std::chrono::steady_clock::now() - opened < 3s) ++cut_within_3s;
        ::close(fd);
      }
    });
  }
  std::this_thread::sleep_for(300ms);  // the slow connections are in
  int scrapes = 0, answered = 0;
  const auto until = std::chrono::steady_clock::now() + 6s;
  while (std::chrono::steady_clock::now() < until) {
    ++scrapes;
    if (shell("curl -s -o /dev/null -w '%{http_code}' --max-time 3 " + url + "/metrics") == "200") ++answered;
    std::this_thread::sleep_for(100ms);
  }
  stop.store(true);
  for (auto& t : attackers) t.join();
  INFO(answered << " of " << scrapes << " scrapes answered; " << cut_within_3s.load() << " of "
                << slow_connections.load() << " slow connections cut within 3 s");
  CHECK(scrapes >= 10);
  CHECK(answered == scrapes);
  CHECK(cut_within_3s.load() >= 16);  // every attacker's first connection at least
  CHECK(daemon.running());
}

}  // namespace gradsync::test
