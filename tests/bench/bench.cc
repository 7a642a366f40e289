// gradsync-bench: measures gradsync on this machine next to the physical floors and the peer
// baseline, all in the same run, and prints medians and ratios (never a pass/fail verdict).
//
//   throughput  4 clients x 100 MiB float32 avg-allreduce, time per step (median of --steps)
//   nodes       2 daemons x 2 clients x 100 MiB float32 avg-allreduce across "nodes" on loopback
//   latency     2 clients x 4 KiB float32 avg-allreduce, round trip median and p99
//   memory      the daemon's own peak memory (anonymous RSS, excluding the client memory it
//               maps), after warm-up and at the end, to show nothing grows per step
//   floors      ../shared/bench/memory_floor.cc and wakeup_latency.cc, built and run here
//   peer        ../shared/bench/torch_gloo_allreduce.py under /usr/bin/python3
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/tools/process.h"
#include "gradsync/client.h"

namespace gradsync {
namespace {

struct BenchOptions {
  std::string team_bench = "../shared/bench";  // where memory_floor.cc & co live
  std::string daemon = executable_directory() + "/gradsyncd";
  int threads = 2;         // daemon reduce threads, and the memory floor's threads
  int steps = 15;          // throughput steps
  int rounds = 2000;       // latency round trips
  bool skip_peer = false;
  // Child mode.
  std::string role;        // "throughput" or "latency"
  int rank = 0;
  std::string socket;
  std::string job;
  std::string rendezvous;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Child process: one trainer of a benchmark job. Rank 0 prints "result <name> <value>" lines.
int run_client(const BenchOptions& o) {
  const bool latency = o.role == "latency";
  const int world = latency ? 2 : 4;
  const int local = o.role == "nodes" ? 2 : world;
  const uint64_t numel = latency ? 1024 : (100ull << 20) / 4;
  auto client = Client::connect(ConnectOptions{o.socket, "gradsync-bench"});
  JoinOptions join{o.job, o.rank, world, o.rank % local, local, std::chrono::milliseconds(0)};
  join.rendezvous = o.rendezvous;
  client->join(join);
  const std::vector<TensorSpec> specs = {TensorSpec{DType::kFloat32, numel, "dp"}};
  const std::vector<SharedTensor> tensors = client->allocate_flat(specs);
  const TensorSet set = client->register_tensors(tensors, {});
  const std::vector<SharedTensor> token = {client->allocate(TensorSpec{DType::kFloat32, 1, "dp"})};
  const TensorSet barrier = client->register_tensors(token, {});
  auto values = tensors[0].as<float>();
  std::fill(values.begin(), values.end(), static_cast<float>(o.rank + 1));
  const int iterations = latency ? o.rounds : o.steps;
  const int warmup = latency ? 200 : 2;
  std::vector<double> us;
  for (int i = 0; i < warmup + iterations; ++i) {
    if (!latency || i == 0) client->allreduce(barrier, ReduceOptions{ReduceOp::kSum}).wait(std::chrono::seconds(60));
    if (!latency && i == warmup) std::printf("phase steady %d\n", o.rank), std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    if (!client->allreduce(set, ReduceOptions{}).wait(std::chrono::seconds(60))) return 1;
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  if (o.rank == 0) {
    std::printf("result median_us %.3f\nresult p99_us %.3f\n", percentile(us, 0.5), percentile(us, 0.99));
  }
  return 0;
}

// The daemon's own memory: anonymous resident pages (heap, stacks, bucket buffers). The client
// segments it maps are shared memory and counted separately by the kernel (RssShmem).
long rss_anon_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::strtol(line.c_str() + 8, nullptr, 10);
  }
  return -1;
}

// Runs a shell command and returns its output.
std::string capture(const std::string& command) {
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    ::pclose(pipe);
  }
  return out;
}

// The number after "key=" in text, or nullopt.
std::optional<double> field(const std::string& text, const std::string& key) {
  const auto pos = text.find(key + "=");
  if (pos == std::string::npos) return std::nullopt;
  return std::strtod(text.c_str() + pos + key.size() + 1, nullptr);
}

struct JobResult {
  double median_us = 0;
  double p99_us = 0;
  long rss_anon_warm_kib = -1;
  long rss_anon_peak_kib = -1;
  long rss_anon_end_kib = -1;
};

JobResult run_job(const BenchOptions& o, const DaemonProcess& daemon, pid_t daemon_pid, const std::string& role,
                  const std::vector<std::string>& sockets = {}, const std::string& rendezvous = {}) {
  const int world = role == "latency" ? 2 : 4;
  const int per_socket = sockets.empty() ? world : world / static_cast<int>(sockets.size());
  const std::string out_file = daemon.directory() + "/" + role + ".out";
  const std::string self = executable_directory() + "/gradsync-bench";
  const std::string job = role + "-" + std::to_string(::getpid());
  std::vector<ChildProcess> clients;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {self, "--role", role, "--rank", std::to_string(r), "--socket",
                                     sockets.empty() ? daemon.socket_path() : sockets[static_cast<size_t>(r / per_socket)],
                                     "--job", job, "--steps", std::to_string(o.steps), "--rounds", std::to_string(o.rounds)};
    if (!rendezvous.empty()) argv.insert(argv.end(), {"--rendezvous", rendezvous});
    clients.emplace_back(argv, r == 0 ? out_file : std::string());
  }
  JobResult result;
  bool all_done = false;
  while (!all_done) {
    all_done = true;
    for (auto& c : clients) all_done &= c.wait_for(std::chrono::milliseconds(0)) != -1;
    const long anon = rss_anon_kib(daemon_pid);
    result.rss_anon_peak_kib = std::max(result.rss_anon_peak_kib, anon);
    if (result.rss_anon_warm_kib < 0 && capture("cat " + out_file + " 2>/dev/null").find("phase steady") != std::string::npos) {
      result.rss_anon_warm_kib = anon;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.rss_anon_end_kib = rss_anon_kib(daemon_pid);
  for (auto& c : clients) {
    if (!exited_ok(c.wait_for(std::chrono::seconds(0)))) {
      std::fprintf(stderr, "gradsync-bench: a %s client failed; see %s\n", role.c_str(), out_file.c_str());
      std::exit(1);
    }
  }
  const std::string text = capture("cat " + out_file);
  if (auto pos = text.find("result median_us "); pos != std::string::npos) result.median_us = std::strtod(text.c_str() + pos + 17, nullptr);
  if (auto pos = text.find("result p99_us "); pos != std::string::npos) result.p99_us = std::strtod(text.c_str() + pos + 14, nullptr);
  return result;
}

int run_bench(const BenchOptions& o) {
  std::printf("gradsync-bench: %u CPUs, daemon with %d reduce threads\n", std::thread::hardware_concurrency(), o.threads);
  DaemonProcess daemon(DaemonProcess::Options{o.daemon,
                                              {"--log-level", "warning", "--reduce-threads", std::to_string(o.threads), "--peer-listen", "127.0.0.1:0"},
                                              ""});
  const pid_t daemon_pid = daemon.process().pid();
  const long idle_kib = rss_anon_kib(daemon_pid);
  const JobResult throughput = run_job(o, daemon, daemon_pid, "throughput");
  const JobResult latency = run_job(o, daemon, daemon_pid, "latency");
  // Two "nodes" on loopback: the first daemon plus a second one; node 0's peer service (a
  // third daemon, so the port is known in advance) is the rendezvous.
  const std::string rendezvous = "127.0.0.1:" + std::to_string(free_loopback_port());
  JobResult nodes;
  {
    const std::vector<std::string> common = {"--log-level", "warning", "--reduce-threads", std::to_string(o.threads)};
    std::vector<std::string> node0 = common, node1 = common;
    node0.insert(node0.end(), {"--peer-listen", rendezvous});
    node1.insert(node1.end(), {"--peer-listen", "127.0.0.1:0"});
    DaemonProcess first(DaemonProcess::Options{o.daemon, node0, ""});
    DaemonProcess second(DaemonProcess::Options{o.daemon, node1, ""});
    nodes = run_job(o, first, first.process().pid(), "nodes", {first.socket_path(), second.socket_path()}, rendezvous);
    first.terminate();
    second.terminate();
  }

  // Floors and peer, same session.
  const std::string tmp = daemon.directory();
  const std::string cc = "c++ -O3 -march=native -pthread ";
  const std::string floor_out = capture(cc + o.team_bench + "/memory_floor.cc -o " + tmp + "/memory_floor && " + tmp +
                                        "/memory_floor 4 100 " + std::to_string(o.threads));
  const std::string wake_out = capture("c++ -O2 -pthread " + o.team_bench + "/wakeup_latency.cc -o " + tmp +
                                       "/wakeup_latency && " + tmp + "/wakeup_latency 20000");
  std::string peer_big, peer_small, engine_floor;
  if (!o.skip_peer) {
    // The cross-node stage alone: Gloo between two processes, 100 MiB. gradsync's two-node job
    // runs exactly this between its daemons, so it is the floor for that row.
    engine_floor = capture("/usr/bin/python3 " + o.team_bench + "/torch_gloo_allreduce.py 2 104857600 " +
                           std::to_string(o.steps) + " 2>&1");
    peer_big = capture("/usr/bin/python3 " + o.team_bench + "/torch_gloo_allreduce.py 4 104857600 " +
                       std::to_string(o.steps) + " 2>&1");
    peer_small = capture("/usr/bin/python3 " + o.team_bench + "/torch_gloo_allreduce.py 2 4096 " +
                         std::to_string(o.rounds) + " 2>&1");
  }
  const double floor_ms = field(floor_out, "median_ms").value_or(0);
  const double futex_us = field(wake_out, "futex").value_or(0);
  const double pipe_us = field(wake_out, "pipe").value_or(0);
  const double peer_big_ms = field(peer_big, "median_ms").value_or(0);
  const double peer_small_ms = field(peer_small, "median_ms").value_or(0);
  const double engine_floor_ms = field(engine_floor, "median_ms").value_or(0);
  const double step_ms = throughput.median_us / 1e3;

  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::printf("\n| measurement | gradsync | floor | ratio to floor | peer (torch gloo) | ratio to peer |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| 4 clients x 100 MiB f32 avg-allreduce, median per step | %.2f ms | %.2f ms (memory_floor, %d threads) | %.2fx | %.2f ms | %.3fx |\n",
              step_ms, floor_ms, o.threads, ratio(step_ms, floor_ms), peer_big_ms, ratio(step_ms, peer_big_ms));
  std::printf("| 4 clients x 100 MiB, p99 per step | %.2f ms | | | | |\n", throughput.p99_us / 1e3);
  std::printf("| 2 daemons x 2 clients x 100 MiB f32 avg-allreduce (loopback), median per step | %.2f ms | %.2f ms (Gloo alone, 2 processes) | %.2fx | %.2f ms (world 4) | %.3fx |\n",
              nodes.median_us / 1e3, engine_floor_ms, ratio(nodes.median_us / 1e3, engine_floor_ms), peer_big_ms,
              ratio(nodes.median_us / 1e3, peer_big_ms));
  std::printf("| 2 clients x 4 KiB f32 avg-allreduce, median round trip | %.1f us | %.1f us (futex round trip) | %.2fx | %.1f us | %.3fx |\n",
              latency.median_us, futex_us, ratio(latency.median_us, futex_us), peer_small_ms * 1e3,
              ratio(latency.median_us, peer_small_ms * 1e3));
  std::printf("| 2 clients x 4 KiB, p99 round trip | %.1f us | %.1f us (pipe round trip) | | | |\n", latency.p99_us, pipe_us);
  std::printf("\ndaemon anonymous memory (beyond the client memory it maps): idle %ld KiB; throughput job: "
              "after warm-up %ld KiB, peak %ld KiB, at the end %ld KiB; latency job: peak %ld KiB\n",
              idle_kib, throughput.rss_anon_warm_kib, throughput.rss_anon_peak_kib, throughput.rss_anon_end_kib,
              latency.rss_anon_peak_kib);
  std::printf("\nraw: %s     %s     %s     %s     %s\n", floor_out.c_str(), wake_out.c_str(), peer_big.c_str(),
              peer_small.c_str(), engine_floor.c_str());
  return daemon.terminate() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  gradsync::BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gradsync-bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::printf("Usage: gradsync-bench [--team-bench DIR] [--threads N] [--steps S] [--rounds R] [--skip-peer]\n"
                  "Measures gradsync next to the memory and wake-up floors and the torch gloo peer, in one run.\n"
                  "  --team-bench DIR  folder with memory_floor.cc, wakeup_latency.cc, torch_gloo_allreduce.py\n"
                  "                    (default ../shared/bench)\n"
                  "  --threads N       daemon reduce threads and memory-floor threads (default 2)\n"
                  "  --steps S         100 MiB steps (default 15);  --rounds R  4 KiB round trips (default 2000)\n"
                  "  --skip-peer       do not run the torch peer\n");
      return 0;
    }
    if (arg == "--team-bench") o.team_bench = next();
    else if (arg == "--daemon") o.daemon = next();
    else if (arg == "--threads") o.threads = std::atoi(next().c_str());
    else if (arg == "--steps") o.steps = std::atoi(next().c_str());
    else if (arg == "--rounds") o.rounds = std::atoi(next().c_str());
    else if (arg == "--skip-peer") o.skip_peer = true;
    else if (arg == "--role") o.role = next();
    else if (arg == "--rank") o.rank = std::atoi(next().c_str());
    else if (arg == "--socket") o.socket = next();
    else if (arg == "--job") o.job = next();
    else if (arg == "--rendezvous") o.rendezvous = next();
    else {
      std::fprintf(stderr, "gradsync-bench: unknown argument '%s' (see --help)\n", arg.c_str());
      return 2;
    }
  }
  if (o.threads < 1 || o.steps < 1 || o.rounds < 1) {
    std::fprintf(stderr, "gradsync-bench: --threads, --steps and --rounds must be positive\n");
    return 2;
  }
  try {
    return o.role.empty() ? gradsync::run_bench(o) : gradsync::run_client(o);
  } catch (const gradsync::Error& e) {
    std::fprintf(stderr, "gradsync-bench: %s\n", e.what());
    return 1;
  }
}
