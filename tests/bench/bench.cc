// gradsync-bench: measures gradsync on this machine next to the physical floors (measured in
// the same run with the project's own code, tests/bench/floors.h) and the peer (torch gloo,
// when /usr/bin/python3 has torch), and prints medians with min-max and ratios: never a
// pass/fail verdict. `--json FILE` writes the same table for scripts. See README "Benchmarks".
//
// A measurement that could not be taken is printed as missing, with why, and the bench exits 1
// after printing everything it did measure; one deliberately not taken (--skip-peer,
// --floors-only, no torch) is printed as skipped and is not a failure.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/tools/process.h"
#include "daemon/engine/host_engine.h"
#include "daemon/reduce/simd.h"
#include "gradsync/client.h"
#include "tests/bench/floors.h"
#include "tests/bench/mpi_run.h"
#include "tests/bench/report.h"
#include "tests/bench/sampled.h"
#include "tests/bench/scrape.h"
#include "tests/bench/supervise.h"
#include "tests/bench/trainer.h"

namespace gradsync::bench {
namespace {

constexpr size_t kMiB = 1 << 20;

struct BenchOptions {
  std::string daemon = executable_directory() + "/gradsyncd";
  std::string python = "/usr/bin/python3";
  std::string json;
  int threads = 2;        // daemon reduce threads, and the memory floor's threads
  int steps = 10;         // timed steps of the large rows
  int rounds = 2000;      // round trips of the 4 KiB row
  int runs = 9;           // runs of the memory floor
  int repeat = 1;         // runs of every gradsync job and Gloo floor, pooled
  int idle_seconds = 60;  // how long the daemon's idle CPU time is measured (0: not measured)
  uint64_t slice_bytes = kDefaultSliceBytes;  // the daemons' --gloo-slice-bytes, and the Gloo floor's
  bool python_given = false;  // --python named: a Python without torch is then missing, not skipped
  bool skip_peer = false;
  bool floors_only = false;
  std::vector<std::string> only;  // --only: the rows to measure (kRowKeys); empty: all

  bool wants(const std::string& key) const { return only.empty() || std::find(only.begin(), only.end(), key) != only.end(); }
};

// The names --only takes, one per row (or pair of rows) of the table.
constexpr const char* kRowKeys[] = {"float32", "float16", "bfloat16", "resnet50", "small",   "mark161",
                                    "mark10k", "eight",   "2x2",      "4x1",      "latency", "reduce_scatter",
                                    "health",  "mask",    "scatter2x2", "wire2x2"};

// The daemon's anonymous resident memory (heap, stacks, staging; not the clients' segments).
long rss_anon_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::strtol(line.c_str() + 8, nullptr, 10);
  }
  return -1;
}

// User plus system CPU time of a process, in milliseconds.
double cpu_ms(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return 0;  // gone: counts nothing
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::strtod(field.c_str(), nullptr);
  }
  return ticks * 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

struct JobSamples {
  Measurement step;     // us per step
  Measurement mark;     // us per tensor spent in mark_ready (mark mode)
  Measurement plain;    // health mode: the plain allreduces interleaved with the fused ones
  long rss_warm_kib = -1, rss_peak_kib = -1, rss_end_kib = -1;
  double daemon_cpu_ms_per_step = -1;  // all the scenario's daemons together, after warm-up
  // Multi-node jobs: node 0's count of the bytes it carried across nodes
  // (gradsync_daemon_cross_node_bytes_total), per step of the job (warm-up included).
  double carried_bytes_per_step = -1;
  // Multi-node jobs: the bytes the loopback interface sent while the job ran (every node's
  // Gloo traffic and the peer service's), per step of the job (warm-up and connecting included).
  double loopback_bytes_per_step = -1;
};

// The bytes the loopback interface has sent (/proc/net/dev), or nullopt where it cannot be read.
std::optional<double> loopback_bytes() {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream name(line.substr(0, colon));
    std::string interface;
    if (!(name >> interface) || interface != "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    double value = 0;
    // Received: bytes packets errs drop fifo frame compressed multicast; then sent bytes.
    for (int i = 0; i < 9 && fields >> value; ++i) {
    }
    if (fields) return value;
  }
  return std::nullopt;
}

std::vector<double> read_values(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::vector<double> values;
  std::string word;
  while (in >> word) {
    double v;
    if (word == key && in >> v) values.push_back(v);
  }
  return values;
}

// The last few hundred bytes of a file, on one line, for a note.
std::string tail_of(const std::string& file) {
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > 300) text = text.substr(text.size() - 300);
  for (char& c : text) {
    if (c == '\n' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = ' ';
  }
  return text.empty() ? "nothing" : "'" + text + "'";
}

// Daemons for one scenario: one, or `nodes` of them on loopback with node 0's peer service as
// the rendezvous and a shared cluster token.
class Daemons {
 public:
  Daemons(const BenchOptions& o, int nodes) {
    std::vector<std::string> common = {"--log-level", "error", "--reduce-threads", std::to_string(o.threads),
                                       "--gloo-slice-bytes", std::to_string(o.slice_bytes)};
    if (nodes > 1) {
      token_ = std::make_unique<ClusterToken>();
      common.insert(common.end(), {"--peer-token-file", token_->path()});
      rendezvous_ = "127.0.0.1:" + std::to_string(free_loopback_port());
    }
    for (int n = 0; n < nodes; ++n) {
      std::vector<std::string> args = common;
      args.insert(args.end(), {"--peer-listen", n == 0 && nodes > 1 ? rendezvous_ : "127.0.0.1:0"});
      // Node 0's metrics: its own count of the bytes it carried across nodes.
      if (n == 0 && nodes > 1) {
        metrics_port_ = free_loopback_port();
        args.insert(args.end(), {"--metrics", "127.0.0.1:" + std::to_string(metrics_port_)});
      }
      daemons_.push_back(std::make_unique<DaemonProcess>(DaemonProcess::Options{o.daemon, args, ""}));
    }
  }
  DaemonProcess& at(int n) { return *daemons_[static_cast<size_t>(n)]; }
  // Node 0's gradsync_daemon_cross_node_bytes_total (jobs ended and running); nullopt on one
  // node or when it cannot be read.
  std::optional<double> carried_bytes() const {
    if (metrics_port_ == 0) return std::nullopt;
    return scrape_counter(metrics_port_, "gradsync_daemon_cross_node_bytes_total");
  }
  const std::string& rendezvous() const { return rendezvous_; }
  // CPU time (user and system) of all of them together, in milliseconds.
  double cpu_ms() const {
    double total = 0;
    for (const auto& d : daemons_) total += bench::cpu_ms(d->process().pid());
    return total;
  }
  bool terminate_all() {
    bool ok = true;
    for (auto& d : daemons_) ok &= exited_ok(d->terminate());
    return ok;
  }

 private:
  std::unique_ptr<ClusterToken> token_;
  std::string rendezvous_;
  int metrics_port_ = 0;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

// One gradsync job: `nodes` x `per_node` trainers, all with `shape` (socket, job and ranks
// filled in here). The first daemon's memory is sampled while it runs.
JobSamples run_job_once(Daemons& daemons, int nodes, int per_node, TrainerArgs shape) {
  static int counter = 0;
  const std::string self = executable_directory() + "/gradsync-bench";
  const std::string out = daemons.at(0).directory() + "/job" + std::to_string(counter) + ".out";
  shape.job = "bench-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  shape.world = nodes * per_node;
  shape.local_world = per_node;
  shape.rendezvous = nodes > 1 ? daemons.rendezvous() : "";
  const std::optional<double> carried_before = daemons.carried_bytes();
  const std::optional<double> loopback_before = nodes > 1 ? loopback_bytes() : std::nullopt;
  std::vector<ChildProcess> trainers;
  for (int r = 0; r < shape.world; ++r) {
    TrainerArgs a = shape;
    a.rank = r;
    a.local_rank = r % per_node;
    a.socket = daemons.at(r / per_node).socket_path();
    std::vector<std::string> argv = trainer_argv(a);
    argv.insert(argv.begin(), self);
    trainers.emplace_back(argv, r == 0 ? out : std::string());
  }
  JobSamples result;
  const pid_t daemon = daemons.at(0).process().pid();
  // The daemons' CPU time from the first timed step rank 0 reports to the last.
  double cpu_at_warm = 0;
  size_t samples_at_warm = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(10);
  for (bool done = false; !done;) {
    done = true;
    for (auto& t : trainers) done &= t.wait_for(std::chrono::milliseconds(0)) != -1;
    if (!done && std::chrono::steady_clock::now() > deadline) {
      for (auto& t : trainers) t.signal(SIGKILL);
      result.step = missing(shape.job + " did not finish in 10 minutes; rank 0 printed: " + tail_of(out));
      return result;
    }
    const long anon = rss_anon_kib(daemon);
    result.rss_peak_kib = std::max(result.rss_peak_kib, anon);
    if (result.rss_warm_kib < 0) {
      samples_at_warm = read_values(out, "sample").size();
      if (samples_at_warm > 0) {
        result.rss_warm_kib = anon;
        cpu_at_warm = daemons.cpu_ms();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.rss_end_kib = rss_anon_kib(daemon);
  const double cpu_at_end = daemons.cpu_ms();
  for (auto& t : trainers) {
    const int status = t.wait_for(std::chrono::seconds(0));
    if (!exited_ok(status)) {
      result.step = missing("a trainer of " + shape.job + " " + describe_wait_status(status) + "; rank 0 printed: " + tail_of(out));
      return result;
    }
  }
  result.step = measured(read_values(out, "sample"));
  if (samples_at_warm > 0 && result.step.samples.size() > samples_at_warm) {
    result.daemon_cpu_ms_per_step =
        (cpu_at_end - cpu_at_warm) / static_cast<double>(result.step.samples.size() - samples_at_warm);
  }
  if (const std::optional<double> after = loopback_before ? loopback_bytes() : std::nullopt; after) {
    result.loopback_bytes_per_step = (*after - *loopback_before) / (shape.warmup + shape.steps);
  }
  if (shape.mode == "mark") result.mark = measured(read_values(out, "mark"));
  if (shape.mode == "health") result.plain = measured(read_values(out, "plain"));
  if (carried_before) {
    // The job's share lands in the daemon-wide counter when its stats are retired, just after
    // its trainers leave: read until it stops growing.
    std::optional<double> after = daemons.carried_bytes();
    for (int i = 0; i < 40; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::optional<double> again = daemons.carried_bytes();
      if (again && after && *again == *after && *after > *carried_before) break;
      after = again;
    }
    if (after) result.carried_bytes_per_step = (*after - *carried_before) / (shape.warmup + shape.steps);
  }
  return result;
}

// The job `repeat` times, one after another, its samples pooled: the cells' medians and ranges
// are then over every timed step of every run. Memory figures are the first run's (warm-up) and
// the largest (peak); a failed run makes the whole measurement missing.
JobSamples run_job(Daemons& daemons, int nodes, int per_node, const TrainerArgs& shape, int repeat) {
  JobSamples all = run_job_once(daemons, nodes, per_node, shape);
  std::vector<double> cpu;  // per run
  if (all.daemon_cpu_ms_per_step >= 0) cpu.push_back(all.daemon_cpu_ms_per_step);
  for (int r = 1; r < repeat && all.step.ok(); ++r) {
    JobSamples more = run_job_once(daemons, nodes, per_node, shape);
    if (!more.step.ok()) return more;
    all.step.samples.insert(all.step.samples.end(), more.step.samples.begin(), more.step.samples.end());
    all.mark.samples.insert(all.mark.samples.end(), more.mark.samples.begin(), more.mark.samples.end());
    all.plain.samples.insert(all.plain.samples.end(), more.plain.samples.begin(), more.plain.samples.end());
    all.rss_peak_kib = std::max(all.rss_peak_kib, more.rss_peak_kib);
    all.rss_end_kib = more.rss_end_kib;
    if (more.daemon_cpu_ms_per_step >= 0) cpu.push_back(more.daemon_cpu_ms_per_step);
    if (all.loopback_bytes_per_step >= 0 && more.loopback_bytes_per_step >= 0) {
      all.loopback_bytes_per_step = (all.loopback_bytes_per_step * r + more.loopback_bytes_per_step) / (r + 1);
    }
  }
  if (!cpu.empty()) all.daemon_cpu_ms_per_step = std::accumulate(cpu.begin(), cpu.end(), 0.0) / static_cast<double>(cpu.size());
  return all;
}

// The health row's figure: the median over steps of (fused / the plain allreduce beside it),
// which a drift of the machine's speed between steps leaves alone.
std::string paired_ratio(const JobSamples& health) {
  const std::vector<double>& fused = health.step.samples;
  const std::vector<double>& plain = health.plain.samples;
  if (fused.empty() || fused.size() != plain.size()) return "";
  std::vector<double> ratios;
  for (size_t i = 0; i < fused.size(); ++i) ratios.push_back(fused[i] / plain[i]);
  char text[96];
  std::snprintf(text, sizeof(text), "fused / plain, median of %zu step pairs: %.3fx; ", ratios.size(),
                measured(ratios).median());
  return text;
}

// Of two floors (one sample each, or none), the faster: a floor is the least the machine did. A
// missing one gives way to the other; two missing, the later says why.
Measurement fastest(const Measurement& a, const Measurement& b) {
  if (!a.ok()) return b;
  if (!b.ok()) return a;
  return a.min() <= b.min() ? a : b;
}

Measurement scaled(Measurement m, double factor) {
  for (double& v : m.samples) v *= factor;
  return m;
}

// Nearest-rank 99th percentile of sorted samples.
double p99_of(const std::vector<double>& sorted) {
  const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(sorted.size())));
  return sorted[std::max<size_t>(rank, 1) - 1];
}

// torch gloo between `world` processes, in milliseconds per step; skipped without torch.
Measurement torch_peer(const BenchOptions& o, bool torch_ok, int world, size_t bytes, int steps) {
  if (o.skip_peer) return skipped("--skip-peer");
  if (!torch_ok) {
    const std::string why = o.python + " cannot import torch";
    return o.python_given ? missing(why) : skipped(why);
  }
  // Bounded: a rank that cannot rendezvous would otherwise wait for torch's 30-minute default.
  // --foreground: the peer stays in the bench's process group, which the supervisor
  // (supervise.h) stops when the bench is interrupted.
  const std::string command = "timeout --foreground -k 5 600 '" + o.python + "' '" + executable_directory() + "/gradsync_torch_peer.py' " +
                              std::to_string(world) + " " + std::to_string(bytes) + " " + std::to_string(steps) + " 2>&1";
  return sampled(command);
}

// "0.147 us in mark_ready" (the client's own time per tensor, median over the steps).
std::string in_mark_ready(const Measurement& mark) {
  if (!mark.ok()) return "";
  char text[96];
  std::snprintf(text, sizeof(text), "; %.3g us in mark_ready (%.3g-%.3g)", mark.median(), mark.min(), mark.max());
  return text;
}

// "CPU per step: daemons 190 ms, Gloo alone 130 ms (2 CPUs)": on a machine with few cores the
// rows across nodes are bound by the CPU time all processes need together, not by Gloo's time.
std::string cpu_per_step(const JobSamples& job, const GlooFloor& gloo, const char* floor = "the Gloo-alone ranks") {
  if (job.daemon_cpu_ms_per_step < 0 && gloo.cpu_ms_per_step < 0) return "";
  auto cell = [](double ms) { return ms < 0 ? std::string("?") : std::to_string(static_cast<long>(std::lround(ms))) + " ms"; };
  return "CPU per step: the daemons " + cell(job.daemon_cpu_ms_per_step) + ", " + floor + " " +
         cell(gloo.cpu_ms_per_step) + " (" + std::to_string(std::thread::hardware_concurrency()) + " CPUs)";
}

std::string per_tensor(const Measurement& with, const Measurement& without, size_t tensors, const char* what) {
  if (!with.ok() || !without.ok()) return "";
  char text[96];
  std::snprintf(text, sizeof(text), "%.3f us per tensor %s", (with.median() - without.median()) / static_cast<double>(tensors), what);
  return text;
}

int run_bench(const BenchOptions& o) {
  const std::string self = executable_directory() + "/gradsync-bench";
  std::printf("gradsync-bench: %u CPUs, daemon with %d reduce threads, reduction loops on %s\n",
              std::thread::hardware_concurrency(), o.threads, reduce::simd::target_name());
  std::fflush(stdout);
  const bool torch_ok =
      !o.skip_peer && std::system(("'" + o.python + "' -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  const Measurement not_run = skipped("--floors-only");
  const Measurement na = skipped("n/a");
  std::vector<Row> rows;
  std::vector<std::pair<std::string, std::string>> extra;
  bool daemons_ok = true;

  // One node.
  TrainerArgs big;
  big.steps = o.steps;
  // A job not selected by --only is printed as skipped.
  JobSamples unselected;
  unselected.step = skipped("not in --only");
  auto want = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return o.wants(k); });
  };
  Measurement floor4_beside, floor_scatter_beside, floor8_beside;  // memory floors taken beside the jobs
  JobSamples f32 = unselected, f16 = unselected, bf16 = unselected, resnet = unselected, resnet_flat = unselected,
             small = unselected, small_flat = unselected, eight = unselected, mark161 = unselected,
             mark10k = unselected, latency = unselected, scatter = unselected, health = unselected,
             separate_health = unselected;
  std::string memory_line, idle_line;
  // A scenario that throws (a daemon that does not come up, a process that cannot start) marks
  // its remaining rows missing, with why; the rest of the run goes on.
  auto stopped = [](std::initializer_list<JobSamples*> jobs, const std::string& why) {
    for (JobSamples* j : jobs) {
      if (!j->step.ok() && !j->step.skipped && j->step.note.empty()) j->step = missing(why);
    }
  };
  const bool one_node = want({"float32", "float16", "bfloat16", "resnet50", "small", "mark161", "mark10k", "eight", "latency",
                              "reduce_scatter", "health"});
  if (!o.floors_only && one_node) try {
    // Every job that will run starts as "not measured" until it has run (a scenario that stops
    // then marks it missing).
    for (auto [job, selected] : std::initializer_list<std::pair<JobSamples*, bool>>{{&f32, want({"float32"})}, {&f16, want({"float16"})}, {&bf16, want({"bfloat16"})},
                                 {&resnet, want({"resnet50", "mark161"})}, {&resnet_flat, want({"resnet50"})},
                                 {&small, want({"small", "mark10k"})}, {&small_flat, want({"small"})},
                                 {&mark161, want({"mark161"})}, {&mark10k, want({"mark10k"})}, {&eight, want({"eight"})},
                                 {&latency, want({"latency"})}, {&scatter, want({"reduce_scatter"})},
                                 {&health, want({"health"})}, {&separate_health, want({"health"})}}) {
      if (selected) *job = JobSamples{};
    }
    Daemons one(o, 1);
    const pid_t pid = one.at(0).process().pid();
    const long idle_kib = rss_anon_kib(pid);
    // One 4-client job of `big`'s shape with another layout, dtype or mode, when selected.
    auto four = [&](JobSamples* into, const std::string& layout, const std::string& dtype, const std::string& mode) {
      if (into->step.skipped) return;
      TrainerArgs a = big;
      a.layout = layout;
      a.dtype = dtype;
      a.mode = mode;
      *into = run_job(one, 1, 4, a, o.repeat);
    };
    // The memory floors are also taken right after the jobs they stand beside, while the daemon
    // idles (besides once more after every job): this VM's memory speed drifts between blocks of
    // a run by more than the few percent between gradsync and its floor, and a floor is the
    // least the machine did at any point of the run.
    const auto floor_beside = [&](Measurement* floor, int clients, bool scatter) {
      *floor = fastest(*floor, memory_floor(clients, 100 * kMiB, o.threads, o.runs, scatter));
    };
    four(&f32, big.layout, big.dtype, "step");
    if (!f32.step.skipped) floor_beside(&floor4_beside, 4, false);
    four(&f16, big.layout, "float16", "step");
    if (!f16.step.skipped) floor_beside(&floor4_beside, 4, false);
    four(&bf16, big.layout, "bfloat16", "step");
    if (!bf16.step.skipped) floor_beside(&floor4_beside, 4, false);
    four(&resnet, "resnet50", "float32", "step");
    four(&mark161, "resnet50", "float32", "mark");
    four(&resnet_flat, "resnet50-flat", "float32", "step");
    four(&small, "small:10000:256", "float32", "step");
    four(&mark10k, "small:10000:256", "float32", "mark");
    four(&small_flat, "small-flat:10000:256", "float32", "step");
    four(&scatter, big.layout, "float32", "reduce_scatter");
    if (!scatter.step.skipped) floor_beside(&floor_scatter_beside, 4, true);
    four(&health, big.layout, "float32", "health");
    four(&separate_health, big.layout, "float32", "separate-health");
    if (!eight.step.skipped) {
      eight = run_job(one, 1, 8, big, o.repeat);
      floor_beside(&floor8_beside, 8, false);
    }
    if (!latency.step.skipped) {
      TrainerArgs l;
      l.layout = "flat:4096";
      l.steps = o.rounds;
      l.warmup = 200;
      l.barrier = false;
      latency = run_job(one, 1, 2, l, o.repeat);
    }
    char text[256];
    if (!f32.step.skipped) {
      std::snprintf(text, sizeof(text),
                    "idle %ld KiB; 4 x 100 MiB float32 job: after warm-up %ld KiB, peak %ld KiB, at the end %ld KiB",
                    idle_kib, f32.rss_warm_kib, f32.rss_peak_kib, f32.rss_end_kib);
      memory_line = text;
    }
    if (o.idle_seconds > 0 && one.at(0).process().wait_for(std::chrono::milliseconds(0)) != -1) {
      idle_line = "not measured: the daemon had exited";
      daemons_ok = false;
    } else if (o.idle_seconds > 0) {
      const double before = cpu_ms(pid);
      std::this_thread::sleep_for(std::chrono::seconds(o.idle_seconds));
      const double used = cpu_ms(pid) - before;
      std::snprintf(text, sizeof(text), "%.0f ms of CPU over %d s idle (%.3f%% of one core), after the jobs above",
                    used, o.idle_seconds, used / (10.0 * o.idle_seconds));
      idle_line = text;
    }
    daemons_ok &= one.terminate_all();
  } catch (const std::exception& e) {
    stopped({&f32, &f16, &bf16, &resnet, &resnet_flat, &small, &small_flat, &eight, &mark161, &mark10k, &latency,
             &scatter, &health, &separate_health},
            std::string("the one-node scenario stopped: ") + e.what());
  }
  // A multi-node row: `nodes` daemons on loopback, `per_node` trainers each, when selected.
  auto across_nodes = [&](std::initializer_list<const char*> keys, int nodes, int per_node, int mask_percent = 0,
                          const std::string& mode = "step", const std::string& dtype = "float32",
                          const std::string& wire = "") {
    if (o.floors_only || !want(keys)) return unselected;
    JobSamples job;
    try {
      Daemons daemons(o, nodes);
      TrainerArgs shape = big;
      shape.mask_percent = mask_percent;
      shape.mode = mode;
      shape.dtype = dtype;
      shape.wire = wire;
      job = run_job(daemons, nodes, per_node, shape, o.repeat);
      daemons_ok &= daemons.terminate_all();
    } catch (const std::exception& e) {
      stopped({&job}, "the " + std::to_string(nodes) + "-node scenario stopped: " + e.what());
    }
    return job;
  };
  const JobSamples two_by_two = across_nodes({"2x2", "mask", "scatter2x2", "wire2x2"}, 2, 2);
  const JobSamples four_by_one = across_nodes({"4x1"}, 4, 1);
  const JobSamples masked = across_nodes({"mask"}, 2, 2, 10);
  const JobSamples scatter_nodes = across_nodes({"scatter2x2"}, 2, 2, 0, "reduce_scatter");
  const JobSamples compressed = across_nodes({"wire2x2"}, 2, 2, 0, "step", "float32", "bfloat16");
  const JobSamples half_default = across_nodes({"wire2x2"}, 2, 2, 0, "step", "bfloat16");
  const JobSamples half_native = across_nodes({"wire2x2"}, 2, 2, 0, "step", "bfloat16", "bfloat16");
  auto ms = [&](const JobSamples& j) { return o.floors_only ? not_run : scaled(j.step, 1e-3); };
  auto us = [&](const JobSamples& j) { return o.floors_only ? not_run : j.step; };

  // Floors and peers, after gradsync so that nothing of theirs runs alongside it.
  const std::string threads = std::to_string(o.threads) + " threads";
  // Each only for a row that --only selected.
  const Measurement not_selected = skipped("not in --only");
  const Measurement floor4 = want({"float32", "float16", "bfloat16"})
                                 ? fastest(floor4_beside, memory_floor(4, 100 * kMiB, o.threads, o.runs))
                                 : not_selected;
  const Measurement floor_scatter =
      want({"reduce_scatter"})
          ? fastest(floor_scatter_beside, memory_floor(4, 100 * kMiB, o.threads, o.runs, /*scatter=*/true))
          : not_selected;
  const Measurement floor8 =
      want({"eight"}) ? fastest(floor8_beside, memory_floor(8, 100 * kMiB, o.threads, o.runs)) : not_selected;
  const Wakeup wake = want({"latency"}) ? wakeup_floor(o.rounds) : Wakeup{not_selected, not_selected, not_selected};
  // Gloo alone `repeat` times, pooled like the gradsync jobs.
  auto gloo_floor = [&](int processes, LocalWork local = {}) {
    GlooFloor all = gloo_alone(self, processes, 100 * kMiB, o.slice_bytes, o.steps, local);
    double cpu_sum = all.cpu_ms_per_step;
    for (int r = 1; r < o.repeat && all.ms.ok(); ++r) {
      GlooFloor more = gloo_alone(self, processes, 100 * kMiB, o.slice_bytes, o.steps, local);
      if (!more.ms.ok()) return more;
      all.ms.samples.insert(all.ms.samples.end(), more.ms.samples.begin(), more.ms.samples.end());
      cpu_sum = cpu_sum < 0 || more.cpu_ms_per_step < 0 ? -1 : cpu_sum + more.cpu_ms_per_step;
    }
    all.cpu_ms_per_step = cpu_sum < 0 ? -1 : cpu_sum / o.repeat;
    return all;
  };
  const GlooFloor gloo2 = want({"2x2"}) ? gloo_floor(2) : GlooFloor{not_selected};
  // The same, each rank also doing its node's least local work (2 clients' buffers) at once.
  const GlooFloor gloo2_local = want({"2x2"}) ? gloo_floor(2, LocalWork{2, o.threads}) : GlooFloor{not_selected};
  const GlooFloor gloo4 = want({"4x1"}) ? gloo_floor(4) : GlooFloor{not_selected};
  char slices[96];
  std::snprintf(slices, sizeof(slices), "%.4g MiB slices", static_cast<double>(o.slice_bytes) / kMiB);
  const Measurement peer4 =
      want({"float32", "2x2", "4x1"}) ? torch_peer(o, torch_ok, 4, 100 * kMiB, o.steps) : not_selected;
  const Measurement peer_small =
      want({"latency"}) ? scaled(torch_peer(o, torch_ok, 2, 4096, o.rounds), 1e3) : not_selected;
  // The second peer (Open MPI) at the first rows' shapes: 4 ranks x 100 MiB, and 2 x 4 KiB.
  const MpiPeer no_mpi{skipped("--skip-peer"), skipped("--skip-peer"), 0, "--skip-peer"};
  const MpiPeer mpi4 = !want({"float32"}) ? MpiPeer{not_selected, not_selected, 0, ""}
                       : o.skip_peer      ? no_mpi
                                          : mpi_peer(4, 100 * kMiB, o.steps);
  const MpiPeer mpi2 = !want({"latency"}) ? MpiPeer{not_selected, not_selected, 0, ""}
                       : o.skip_peer      ? no_mpi
                                          : mpi_peer(2, 4096, std::min(o.rounds, 2000));
  const auto tuned = [](const MpiPeer& p, double scale, const char* unit) {
    if (!p.best_tuned.ok()) return p.tuned_note;
    char text[160];
    std::snprintf(text, sizeof(text), "%s: %.4g %s", p.tuned_note.c_str(), p.best_tuned.median() * scale, unit);
    return std::string(text);
  };

  rows.push_back({"4 clients x 100 MiB float32, per step", "ms", ms(f32), floor4, "memory floor, best run, " + threads, peer4, ""});
  rows.push_back({"4 clients x 100 MiB float32, per step, peer Open MPI MPI_Allreduce (shared memory)", "ms", ms(f32),
                  floor4, "memory floor, best run, " + threads, scaled(mpi4.by_default, 1e-3),
                  "peer: Open MPI's default algorithm; " + tuned(mpi4, 1e-3, "ms")});
  rows.push_back({"4 clients x 100 MiB float16, per step", "ms", ms(f16), floor4, "memory floor, same bytes", na, ""});
  rows.push_back({"4 clients x 100 MiB bfloat16, per step", "ms", ms(bf16), floor4, "memory floor, same bytes", na, ""});
  rows.push_back({"4 clients x 100 MiB float32 reduce-scatter, per step", "ms", ms(scatter), floor_scatter,
                  "memory floor (best run): read 4 x 100 MiB, write 100 MiB, " + threads,
                  skipped("n/a: torch's gloo backend has no reduce_scatter"), ""});
  rows.push_back({"4 clients x 100 MiB float32, allreduce with fused health, per step", "ms", ms(health),
                  health.step.ok() ? scaled(health.plain, 1e-3) : ms(health),
                  "a plain allreduce of the same set, alternating step by step with it in the same job",
                  ms(separate_health),
                  paired_ratio(health) +
                      "peer: the plain allreduce, then each trainer's own pass over its results (inf, NaN, norm)"});
  rows.push_back({"4 clients x ResNet-50 as 161 tensors, per step", "ms", ms(resnet), ms(resnet_flat),
                  "the same bytes as one flat buffer", na, ""});
  rows.push_back({"4 clients x 10,000 tensors of 1 KiB, per step", "ms", ms(small), ms(small_flat),
                  "the same bytes as one flat buffer", na,
                  per_tensor(us(small), us(small_flat), 10000, "(daemon and client overhead)")});
  rows.push_back({"4 clients x 161 tensors, mark_ready each, per step", "ms", ms(mark161), ms(resnet),
                  "allreduce of the whole set", na,
                  per_tensor(us(mark161), us(resnet), 161, "over allreduce") + in_mark_ready(mark161.mark)});
  rows.push_back({"4 clients x 10,000 tensors, mark_ready each, per step", "ms", ms(mark10k), ms(small),
                  "allreduce of the whole set", na,
                  per_tensor(us(mark10k), us(small), 10000, "over allreduce") + in_mark_ready(mark10k.mark)});
  rows.push_back({"8 clients x 100 MiB float32, per step", "ms", ms(eight), floor8, "memory floor, best run, " + threads, na, ""});
  rows.push_back({"2 nodes x 2 clients x 100 MiB float32 (loopback), per step", "ms", ms(two_by_two), gloo2.ms,
                  std::string("Gloo alone, 2 processes, ") + slices + ", ring", peer4, cpu_per_step(two_by_two, gloo2)});
  rows.push_back({"2 nodes x 2 clients x 100 MiB float32 (loopback), per step, on shared CPUs", "ms", ms(two_by_two),
                  gloo2_local.ms,
                  "Gloo alone as above, each process also reducing 2 x 100 MiB in place on " + threads +
                      " at the same time (the memory floor): the nodes share these CPUs",
                  na, cpu_per_step(two_by_two, gloo2_local, "the floor's ranks")});
  std::string carried = "bytes carried across nodes not read";
  if (masked.carried_bytes_per_step > 0 && two_by_two.carried_bytes_per_step > 0) {
    char text[200];
    std::snprintf(text, sizeof(text), "node 0 carried %.1f MiB per step, %.1f%% of the unmasked %.1f MiB (its counter)",
                  masked.carried_bytes_per_step / kMiB, 100.0 * masked.carried_bytes_per_step / two_by_two.carried_bytes_per_step,
                  two_by_two.carried_bytes_per_step / kMiB);
    carried = text;
  }
  rows.push_back({"2 nodes x 2 clients x 100 MiB float32, mask keeping 10% (loopback), per step", "ms", ms(masked),
                  ms(two_by_two), "the unmasked 2 x 2 row, same run", na, carried});
  // What the loopback sent for `job`, against `beside` (what its floor column names).
  auto sent = [](const JobSamples& job, const JobSamples& beside, const char* what) {
    if (job.loopback_bytes_per_step <= 0 || beside.loopback_bytes_per_step <= 0) return std::string("loopback bytes not read");
    char text[200];
    std::snprintf(text, sizeof(text), "the loopback sent %.1f MiB per step, %.1f%% of %s %.1f MiB",
                  job.loopback_bytes_per_step / kMiB, 100.0 * job.loopback_bytes_per_step / beside.loopback_bytes_per_step,
                  what, beside.loopback_bytes_per_step / kMiB);
    return std::string(text);
  };
  rows.push_back({"2 nodes x 2 clients x 100 MiB float32 reduce-scatter (loopback), per step", "ms",
                  ms(scatter_nodes), ms(two_by_two), "the 2 x 2 allreduce row, same run", na,
                  sent(scatter_nodes, two_by_two, "the allreduce's")});
  rows.push_back({"2 nodes x 2 clients x 100 MiB float32, bfloat16 on the wire (loopback), per step", "ms",
                  ms(compressed), ms(two_by_two), "the 2 x 2 allreduce row (float32 on the wire), same run", na,
                  sent(compressed, two_by_two, "the float32 wire's")});
  rows.push_back({"2 nodes x 2 clients x 100 MiB bfloat16, in its own type on the wire (loopback), per step", "ms",
                  ms(half_native), ms(half_default),
                  "the same bfloat16 job carried as float32 sums (the default), same run", na,
                  sent(half_native, half_default, "the default's")});
  rows.push_back({"4 nodes x 1 client x 100 MiB float32 (loopback), per step", "ms", ms(four_by_one), gloo4.ms,
                  std::string("Gloo alone, 4 processes, ") + slices + ", ring", peer4, cpu_per_step(four_by_one, gloo4)});
  std::string p99;
  if (latency.step.ok() && wake.futex_us.ok()) {
    Measurement sorted = latency.step;
    std::sort(sorted.samples.begin(), sorted.samples.end());
    Measurement fs = wake.futex_us;
    std::sort(fs.samples.begin(), fs.samples.end());
    char text[160];
    std::snprintf(text, sizeof(text),
                  "p99 %.1f us; references: futex round trip median %.1f us (p99 %.1f us), pipe median %.1f us",
                  p99_of(sorted.samples), fs.median(), p99_of(fs.samples),
                  wake.pipe_us.ok() ? wake.pipe_us.median() : -1.0);
    p99 = text;
  }
  rows.push_back({"2 clients x 4 KiB float32, round trip", "us", us(latency), wake.spin_us,
                  "cache-line ping-pong between two spinning processes", peer_small, p99});
  rows.push_back({"2 clients x 4 KiB float32, round trip, peer Open MPI MPI_Allreduce (shared memory)", "us",
                  us(latency), wake.spin_us, "cache-line ping-pong between two spinning processes", mpi2.by_default,
                  "peer: Open MPI's default algorithm; " + tuned(mpi2, 1.0, "us")});
  // A floor is the least the work can take: a row faster than its floor shows a defect in the
  // floor (a loose reference), and says so rather than claim a ratio below 1.
  for (Row& row : rows) {
    if (!row.gradsync.ok() || !row.floor.ok() || row.gradsync.median() >= row.floor.median()) continue;
    if (row.floor_name.find("memory floor") == std::string::npos &&
        row.floor_name.find("ping-pong") == std::string::npos) {
      continue;  // not a physical floor (Gloo alone, another row of the same run)
    }
    row.derived += std::string(row.derived.empty() || row.derived == "-" ? "" : "; ") +
                   "faster than its floor: a defect in the floor, not a result";
  }

  print_table(rows);
  if (!memory_line.empty()) std::printf("\ndaemon anonymous memory (beyond the client memory it maps): %s\n", memory_line.c_str());
  if (!idle_line.empty()) std::printf("daemon CPU while idle: %s\n", idle_line.c_str());
  extra = {{"cpus", std::to_string(std::thread::hardware_concurrency())}, {"reduce_threads", std::to_string(o.threads)},
           {"simd_target", reduce::simd::target_name()}, {"daemon_memory", memory_line}, {"daemon_idle_cpu", idle_line}};
  int status = 0;
  if (!o.json.empty() && !write_json(o.json, rows, extra)) {
    std::fprintf(stderr, "gradsync-bench: cannot write --json %s\n", o.json.c_str());
    status = 1;
  }
  const auto absent = missing_measurements(rows);
  if (!absent.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "gradsync-bench: %zu measurement(s) missing; see above\n", absent.size());
    status = 1;
  }
  if (!daemons_ok) {
    std::fprintf(stderr, "gradsync-bench: a daemon did not exit cleanly on SIGTERM\n");
    status = 1;
  }
  return status;
}

// --slice-bytes: what gradsyncd's --gloo-slice-bytes takes.
uint64_t slice_bytes(const std::string& text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0])) || *end != '\0' || value < 4096 ||
      value > (1ull << 40)) {
    throw std::invalid_argument("--slice-bytes must be a number of bytes from 4096 to 2^40, not '" + text + "'");
  }
  return value;
}

// "2x2,latency" -> {"2x2", "latency"}; an unknown name is an error that lists the known ones.
std::vector<std::string> parse_only(const std::string& list) {
  std::vector<std::string> keys;
  std::istringstream in(list);
  for (std::string key; std::getline(in, key, ',');) {
    if (std::find_if(std::begin(kRowKeys), std::end(kRowKeys), [&](const char* k) { return key == k; }) ==
        std::end(kRowKeys)) {
      std::string known;
      for (const char* k : kRowKeys) known += (known.empty() ? "" : ", ") + std::string(k);
      throw std::invalid_argument("--only: unknown row '" + key + "' (one or more of " + known + ", comma-separated)");
    }
    keys.push_back(key);
  }
  if (keys.empty()) throw std::invalid_argument("--only needs at least one row name");
  return keys;
}

constexpr const char* kHelp =
    "Usage: gradsync-bench [--threads N] [--steps S] [--rounds R] [--runs K] [--repeat N] [--idle-seconds T]\n"
    "                      [--skip-peer] [--floors-only] [--only ROWS] [--slice-bytes N] [--json FILE]\n"
    "                      [--python PATH] [--daemon PATH]\n"
    "Measures gradsync on this machine next to its floors and the torch gloo peer, all in one run,\n"
    "and prints medians with min-max and ratios. Needs nothing outside the build: the floors are\n"
    "the project's own code (an in-place N-way reduction on private memory, a cache-line ping-pong\n"
    "between two spinning processes (with futex and pipe round trips beside it as references),\n"
    "Gloo alone between the same number of processes, and for 2x2 also Gloo alone with each\n"
    "process doing a node's least local work beside it, on the same CPUs). A row faster than its\n"
    "physical floor says so: that is a defect in the floor. A second peer, Open MPI's MPI_Allreduce\n"
    "over shared memory (its default algorithm and the best of its tuned ones), runs beside the\n"
    "4 x 100 MiB and 4 KiB rows where Open MPI is installed, and is printed as skipped elsewhere.\n"
    "  --threads N       daemon reduce threads and memory-floor threads (default 2)\n"
    "  --steps S         timed steps of each large row (default 10)\n"
    "  --rounds R        4 KiB round trips (default 2000)\n"
    "  --runs K          memory-floor runs (default 9)\n"
    "  --repeat N        run every gradsync job and Gloo floor N times, pooling their steps\n"
    "                    (default 1)\n"
    "  --idle-seconds T  measure the daemon's CPU time over T idle seconds (default 60; 0: skip)\n"
    "  --skip-peer       do not run the peers, torch gloo and Open MPI (printed as skipped)\n"
    "  --floors-only     do not run gradsync, only the floors and the peers\n"
    "  --slice-bytes N   the daemons' --gloo-slice-bytes, and the slices of the Gloo floor (default\n"
    "                    64 MiB): measure the slice size for your nodes\n"
    "  --only ROWS       measure only these rows, comma-separated (the others print as skipped):\n"
    "                    float32, float16, bfloat16, resnet50, small, mark161, mark10k, eight,\n"
    "                    2x2 (two rows: against Gloo alone and against the shared-CPU floor),\n"
    "                    4x1, latency, reduce_scatter, health, mask (2 x 2 with a mask keeping\n"
    "                    10%, beside the unmasked 2 x 2 and with the bytes node 0 counted),\n"
    "                    scatter2x2 (a 2 x 2 reduce-scatter, beside the 2 x 2 allreduce and\n"
    "                    with the bytes the loopback sent for each), wire2x2 (2 x 2 float32\n"
    "                    with bfloat16 on the wire beside the 2 x 2 allreduce, and a bfloat16\n"
    "                    set in its own type beside the same set carried as float32; bytes sent)\n"
    "  --json FILE       also write the table to FILE as JSON\n"
    "  --python PATH     the Python with torch for the peer (default /usr/bin/python3; without\n"
    "                    torch the peer is printed as skipped)\n"
    "  --daemon PATH     the gradsyncd to measure (default: the one beside this program)\n"
    "A measurement that could not be taken is printed as missing, with why, and the bench then\n"
    "exits 1.\n";

}  // namespace
}  // namespace gradsync::bench

int main(int argc, char** argv) {
  using namespace gradsync::bench;
  BenchOptions o;
  std::string role, store, gloo_host = "127.0.0.1";
  int rank = 0, size = 0;
  size_t bytes = 0;
  LocalWork local;  // --role gloo-floor: the node's local work beside Gloo
  TrainerArgs trainer;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
        return argv[++i];
      };
      auto positive = [&](int* into) {
        *into = std::atoi(next().c_str());
        if (*into < 0 || (*into == 0 && arg != "--idle-seconds")) throw std::invalid_argument(arg + " must be a positive integer");
      };
      if (arg == "--help" || arg == "-h") {
        std::printf("%s", kHelp);
        return 0;
      }
      if (arg == "--role") role = next();
      else if (role == "trainer" && parse_trainer_flag(argc, argv, i, trainer)) continue;
      else if (arg == "--store") store = next();
      else if (arg == "--gloo-host") gloo_host = next();
      else if (arg == "--rank") rank = std::atoi(next().c_str());
      else if (arg == "--size") size = std::atoi(next().c_str());
      else if (arg == "--bytes") bytes = std::strtoull(next().c_str(), nullptr, 10);
      else if (arg == "--local-clients") local.clients = std::atoi(next().c_str());
      else if (arg == "--slice-bytes") o.slice_bytes = slice_bytes(next());
      else if (arg == "--daemon") o.daemon = next();
      else if (arg == "--python") o.python = next(), o.python_given = true;
      else if (arg == "--json") o.json = next();
      else if (arg == "--threads") positive(&o.threads);
      else if (arg == "--steps") positive(&o.steps), trainer.steps = o.steps;
      else if (arg == "--rounds") positive(&o.rounds);
      else if (arg == "--runs") positive(&o.runs);
      else if (arg == "--repeat") positive(&o.repeat);
      else if (arg == "--idle-seconds") positive(&o.idle_seconds);
      else if (arg == "--skip-peer") o.skip_peer = true;
      else if (arg == "--floors-only") o.floors_only = true;
      else if (arg == "--only") o.only = parse_only(next());
      else throw std::invalid_argument("unknown argument '" + arg + "' (see --help)");
    }
    if (role == "trainer") return run_trainer(trainer);
    local.threads = o.threads;
    if (role == "gloo-floor") return run_gloo_rank(store, rank, size, bytes, o.slice_bytes, o.steps, local, gloo_host);
    if (!role.empty()) throw std::invalid_argument("unknown --role '" + role + "'");
    return run_supervised([&] { return run_bench(o); });
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gradsync-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync-bench: %s\n", e.what());
    return 1;
  }
}
