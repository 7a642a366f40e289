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
//
// A measurement that could not be taken (a floor or peer command failed, or printed no number)
// is printed as "missing" with the command and how it ended, and the bench then exits 1 after
// printing everything it did measure. One deliberately not taken (--skip-peer, --floors-only)
// is printed as "skipped" and is not a failure.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
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
  bool floors_only = false;  // no gradsync jobs: only the floors and the peer
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

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// One number of the report: measured (value set), deliberately skipped, or missing because it
// could not be taken. `note` says why there is no value: the flag that skipped it, or for a
// missing one what failed (the command and its exit status).
struct Measurement {
  std::optional<double> value;
  bool skipped = false;
  std::string note;
};

Measurement measured(double value) { return Measurement{value, false, {}}; }
Measurement skipped(const std::string& why) { return Measurement{std::nullopt, true, why}; }
Measurement missing(const std::string& why) { return Measurement{std::nullopt, false, why}; }

// A shell command's output and how it ended.
struct CommandRun {
  std::string command;
  std::string output;
  int status = -1;  // pclose's wait status; -1 when the shell could not be started
  bool ran = false;  // false: deliberately not run
};

CommandRun run_command(const std::string& command) {
  CommandRun run{command, {}, -1, true};
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
    run.status = ::pclose(pipe);
  }
  return run;
}

// The number after "key=" in the command's output; missing, naming the command and its exit
// status, when the command failed or printed no such number.
Measurement field(const CommandRun& run, const std::string& key, const std::string& skip_reason) {
  if (!run.ran) return skipped(skip_reason);
  if (run.status == -1) return missing("`" + run.command + "` could not be started");
  if (!exited_ok(run.status)) return missing("`" + run.command + "` " + describe_wait_status(run.status));
  const auto pos = run.output.find(key + "=");
  if (pos == std::string::npos) return missing("`" + run.command + "` exited 0 but printed no " + key + "=");
  return measured(std::strtod(run.output.c_str() + pos + key.size() + 1, nullptr));
}

// a / b, absent (missing before skipped) when either is.
Measurement ratio(const Measurement& a, const Measurement& b) {
  if (a.value && b.value) return *b.value > 0 ? measured(*a.value / *b.value) : missing("a zero denominator");
  if ((!a.value && !a.skipped) || (!b.value && !b.skipped)) return missing("an input is missing");
  return skipped("an input was skipped");
}

// The value scaled and printed with `format` ("%.2f ms"), or "missing" / "skipped".
std::string cell(const Measurement& m, const char* format, double scale = 1) {
  if (!m.value) return m.skipped ? "skipped" : "missing";
  char text[64];
  std::snprintf(text, sizeof(text), format, *m.value * scale);
  return text;
}

struct JobResult {
  Measurement median_us;
  Measurement p99_us;
  long rss_anon_warm_kib = -1;
  long rss_anon_peak_kib = -1;
  long rss_anon_end_kib = -1;
};

// A temporary directory for the floors' binaries, removed with everything in it.
class TempDirectory {
 public:
  TempDirectory() {
    char pattern[] = "/tmp/gradsync-bench-XXXXXX";
    if (!::mkdtemp(pattern)) throw Error(Status::internal("mkdtemp failed for the floors' directory"));
    path_ = pattern;
  }
  ~TempDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
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
    if (result.rss_anon_warm_kib < 0 && read_text(out_file).find("phase steady") != std::string::npos) {
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
  const std::string text = read_text(out_file);
  auto result_line = [&](const std::string& name) {
    const std::string prefix = "result " + name + " ";
    const auto pos = text.find(prefix);
    if (pos == std::string::npos) return missing("the " + role + " job's rank 0 exited 0 but printed no '" + prefix + "'");
    return measured(std::strtod(text.c_str() + pos + prefix.size(), nullptr));
  };
  result.median_us = result_line("median_us");
  result.p99_us = result_line("p99_us");
  return result;
}

JobResult skipped_job() {
  return JobResult{skipped("--floors-only"), skipped("--floors-only")};
}

// The gradsync jobs, each on fresh daemons; with --floors-only, all skipped.
struct GradsyncResults {
  JobResult throughput = skipped_job();
  JobResult latency = skipped_job();
  JobResult nodes = skipped_job();
  long idle_kib = -1;
  bool daemons_ok = true;  // every daemon exited cleanly
};

GradsyncResults run_gradsync(const BenchOptions& o) {
  GradsyncResults r;
  if (o.floors_only) return r;
  DaemonProcess daemon(DaemonProcess::Options{o.daemon,
                                              {"--log-level", "warning", "--reduce-threads", std::to_string(o.threads), "--peer-listen", "127.0.0.1:0"},
                                              ""});
  const pid_t daemon_pid = daemon.process().pid();
  r.idle_kib = rss_anon_kib(daemon_pid);
  r.throughput = run_job(o, daemon, daemon_pid, "throughput");
  r.latency = run_job(o, daemon, daemon_pid, "latency");
  // Two "nodes" on loopback: the first daemon plus a second one; node 0's peer service (a
  // third daemon, so the port is known in advance) is the rendezvous.
  const std::string rendezvous = "127.0.0.1:" + std::to_string(free_loopback_port());
  {
    ClusterToken token;
    const std::vector<std::string> common = {"--log-level", "warning", "--reduce-threads", std::to_string(o.threads),
                                             "--peer-token-file", token.path()};
    std::vector<std::string> node0 = common, node1 = common;
    node0.insert(node0.end(), {"--peer-listen", rendezvous});
    node1.insert(node1.end(), {"--peer-listen", "127.0.0.1:0"});
    DaemonProcess first(DaemonProcess::Options{o.daemon, node0, ""});
    DaemonProcess second(DaemonProcess::Options{o.daemon, node1, ""});
    r.nodes = run_job(o, first, first.process().pid(), "nodes", {first.socket_path(), second.socket_path()}, rendezvous);
    first.terminate();
    second.terminate();
  }
  r.daemons_ok = daemon.terminate() == 0;
  return r;
}

int run_bench(const BenchOptions& o) {
  std::printf("gradsync-bench: %u CPUs, daemon with %d reduce threads\n", std::thread::hardware_concurrency(), o.threads);
  const GradsyncResults gradsync = run_gradsync(o);
  const JobResult& throughput = gradsync.throughput;
  const JobResult& latency = gradsync.latency;
  const JobResult& nodes = gradsync.nodes;

  // Floors and peer, same session.
  const TempDirectory tmp_dir;
  const std::string tmp = tmp_dir.path();
  const std::string cc = "c++ -O3 -march=native -pthread ";
  const CommandRun floor_run = run_command(cc + o.team_bench + "/memory_floor.cc -o " + tmp + "/memory_floor && " + tmp +
                                           "/memory_floor 4 100 " + std::to_string(o.threads));
  const CommandRun wake_run = run_command("c++ -O2 -pthread " + o.team_bench + "/wakeup_latency.cc -o " + tmp +
                                          "/wakeup_latency && " + tmp + "/wakeup_latency 20000");
  CommandRun peer_big, peer_small, engine_floor;
  if (!o.skip_peer) {
    // The cross-node stage alone: Gloo between two processes, 100 MiB. gradsync's two-node job
    // runs exactly this between its daemons, so it is the floor for that row.
    engine_floor = run_command("/usr/bin/python3 " + o.team_bench + "/torch_gloo_allreduce.py 2 104857600 " +
                               std::to_string(o.steps) + " 2>&1");
    peer_big = run_command("/usr/bin/python3 " + o.team_bench + "/torch_gloo_allreduce.py 4 104857600 " +
                           std::to_string(o.steps) + " 2>&1");
    peer_small = run_command("/usr/bin/python3 " + o.team_bench + "/torch_gloo_allreduce.py 2 4096 " +
                             std::to_string(o.rounds) + " 2>&1");
  }
  const Measurement floor_ms = field(floor_run, "median_ms", "");
  const Measurement futex_us = field(wake_run, "futex", "");
  const Measurement pipe_us = field(wake_run, "pipe", "");
  const Measurement peer_big_ms = field(peer_big, "median_ms", "--skip-peer");
  const Measurement peer_small_ms = field(peer_small, "median_ms", "--skip-peer");
  const Measurement engine_floor_ms = field(engine_floor, "median_ms", "--skip-peer");
  // Ratios in one unit: milliseconds for the 100 MiB rows, microseconds for the 4 KiB rows.
  auto scaled = [](Measurement m, double scale) {
    if (m.value) *m.value *= scale;
    return m;
  };
  const Measurement step_ms = scaled(throughput.median_us, 1e-3);
  const Measurement nodes_ms = scaled(nodes.median_us, 1e-3);
  const Measurement peer_small_us = scaled(peer_small_ms, 1e3);

  std::printf("\n| measurement | gradsync | floor | ratio to floor | peer (torch gloo) | ratio to peer |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| 4 clients x 100 MiB f32 avg-allreduce, median per step | %s | %s (memory_floor, %d threads) | %s | %s | %s |\n",
              cell(step_ms, "%.2f ms").c_str(), cell(floor_ms, "%.2f ms").c_str(), o.threads,
              cell(ratio(step_ms, floor_ms), "%.2fx").c_str(), cell(peer_big_ms, "%.2f ms").c_str(),
              cell(ratio(step_ms, peer_big_ms), "%.3fx").c_str());
  std::printf("| 4 clients x 100 MiB, p99 per step | %s | | | | |\n", cell(throughput.p99_us, "%.2f ms", 1e-3).c_str());
  std::printf("| 2 daemons x 2 clients x 100 MiB f32 avg-allreduce (loopback), median per step | %s | %s (Gloo alone, 2 processes) | %s | %s (world 4) | %s |\n",
              cell(nodes_ms, "%.2f ms").c_str(), cell(engine_floor_ms, "%.2f ms").c_str(),
              cell(ratio(nodes_ms, engine_floor_ms), "%.2fx").c_str(), cell(peer_big_ms, "%.2f ms").c_str(),
              cell(ratio(nodes_ms, peer_big_ms), "%.3fx").c_str());
  std::printf("| 2 clients x 4 KiB f32 avg-allreduce, median round trip | %s | %s (futex round trip) | %s | %s | %s |\n",
              cell(latency.median_us, "%.1f us").c_str(), cell(futex_us, "%.1f us").c_str(),
              cell(ratio(latency.median_us, futex_us), "%.2fx").c_str(), cell(peer_small_us, "%.1f us").c_str(),
              cell(ratio(latency.median_us, peer_small_us), "%.3fx").c_str());
  std::printf("| 2 clients x 4 KiB, p99 round trip | %s | %s (pipe round trip) | | | |\n",
              cell(latency.p99_us, "%.1f us").c_str(), cell(pipe_us, "%.1f us").c_str());
  if (o.floors_only) {
    std::printf("\ndaemon anonymous memory: skipped (--floors-only)\n");
  } else {
    std::printf("\ndaemon anonymous memory (beyond the client memory it maps): idle %ld KiB; throughput job: "
                "after warm-up %ld KiB, peak %ld KiB, at the end %ld KiB; latency job: peak %ld KiB\n",
                gradsync.idle_kib, throughput.rss_anon_warm_kib, throughput.rss_anon_peak_kib,
                throughput.rss_anon_end_kib, latency.rss_anon_peak_kib);
  }
  std::printf("\nraw: %s     %s     %s     %s     %s\n", floor_run.output.c_str(), wake_run.output.c_str(),
              peer_big.output.c_str(), peer_small.output.c_str(), engine_floor.output.c_str());

  const std::pair<const char*, const Measurement*> all[] = {
      {"gradsync 4 x 100 MiB median", &throughput.median_us}, {"gradsync 4 x 100 MiB p99", &throughput.p99_us},
      {"gradsync 2 nodes x 100 MiB median", &nodes.median_us}, {"gradsync 2 x 4 KiB median", &latency.median_us},
      {"gradsync 2 x 4 KiB p99", &latency.p99_us},            {"memory floor", &floor_ms},
      {"futex round trip", &futex_us},                         {"pipe round trip", &pipe_us},
      {"peer 4 x 100 MiB", &peer_big_ms},                      {"peer 2 x 4 KiB", &peer_small_ms},
      {"Gloo alone 2 x 100 MiB", &engine_floor_ms},
  };
  int missing_count = 0;
  for (const auto& [name, m] : all) {
    if (m->value || m->skipped) continue;
    if (missing_count++ == 0) std::printf("\n");
    std::printf("missing: %s: %s\n", name, m->note.c_str());
  }
  if (missing_count > 0) {
    std::fflush(stdout);
    std::fprintf(stderr, "gradsync-bench: %d measurement(s) missing; see above\n", missing_count);
  }
  return missing_count == 0 && gradsync.daemons_ok ? 0 : 1;
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
                  "                      [--floors-only]\n"
                  "Measures gradsync next to the memory and wake-up floors and the torch gloo peer, in one run.\n"
                  "  --team-bench DIR  folder with memory_floor.cc, wakeup_latency.cc, torch_gloo_allreduce.py\n"
                  "                    (default ../shared/bench)\n"
                  "  --threads N       daemon reduce threads and memory-floor threads (default 2)\n"
                  "  --steps S         100 MiB steps (default 15);  --rounds R  4 KiB round trips (default 2000)\n"
                  "  --skip-peer       do not run the torch peer (printed as skipped)\n"
                  "  --floors-only     do not run gradsync, only the floors and the peer (gradsync printed as skipped)\n"
                  "A measurement that could not be taken is printed as missing, with the command and its exit\n"
                  "status, and the bench then exits 1.\n");
      return 0;
    }
    if (arg == "--team-bench") o.team_bench = next();
    else if (arg == "--daemon") o.daemon = next();
    else if (arg == "--threads") o.threads = std::atoi(next().c_str());
    else if (arg == "--steps") o.steps = std::atoi(next().c_str());
    else if (arg == "--rounds") o.rounds = std::atoi(next().c_str());
    else if (arg == "--skip-peer") o.skip_peer = true;
    else if (arg == "--floors-only") o.floors_only = true;
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
