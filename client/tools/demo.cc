// gradsync-demo: the main job. Starts a gradsyncd on a private socket and N trainer processes
// on this machine; with --nodes M, M daemons on loopback (each its own socket and peer port,
// node 0's peer service as the rendezvous, or the etcd cluster --rendezvous names) with N
// trainers each, forming one job of M * N ranks. Each trainer registers gradients laid out
// like a real model's parameters
// (one flat buffer with a view per parameter, like DDP's gradient_as_bucket_view), and every
// step fills them with rank-dependent values, marks them ready in reverse order as autograd
// hooks would, waits for the coalesced average, and checks every element against the exact
// expected value. Exits non-zero on any mismatch or error.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/tools/model_layouts.h"
#include "client/tools/process.h"
#include "gradsync/client.h"

namespace gradsync {
namespace {

struct DemoOptions {
  int clients = 4;  // per node
  int nodes = 1;
  int steps = 10;
  std::string model = "resnet50";
  std::string socket;  // empty: start a daemon
  std::string daemon = executable_directory() + "/gradsyncd";
  std::string job = "demo";
  // With --nodes: etcd://... to form through etcd (empty: node 0's daemon). Trainer processes
  // of a multi-node run get the rendezvous in effect.
  std::string rendezvous;
  std::vector<std::string> daemon_args;  // --daemon-arg, for every daemon started
  int trainer_rank = -1;   // set in trainer processes
  bool help = false;
};

const char* kUsage =
    "Usage: gradsync-demo [--clients N] [--nodes M] [--steps S] [--model resnet50|tiny] [--socket PATH]\n"
    "                     [--daemon PATH] [--rendezvous etcd://HOST:PORT[,...]] [--daemon-arg ARG]...\n"
    "\n"
    "Runs a gradsyncd on a private socket (or uses the one at --socket) and N trainer processes\n"
    "that average their gradients for S steps, checking every element exactly. With --nodes M it\n"
    "runs M daemons on loopback, N trainers each, as the nodes of one job.\n"
    "  --clients N    trainer processes per node (default 4)\n"
    "  --nodes M      daemons, one per simulated node (default 1, at most 128)\n"
    "  --steps S      training steps (default 10)\n"
    "  --model M      parameter layout: resnet50 (161 tensors, 25.6 M floats) or tiny\n"
    "  --socket PATH  use a running gradsyncd instead of starting one\n"
    "  --daemon PATH  the gradsyncd binary to start (default: next to this program)\n"
    "  --rendezvous etcd://HOST:PORT[,HOST:PORT...]\n"
    "                 with --nodes: the nodes form through this etcd cluster instead of node 0's\n"
    "                 daemon\n"
    "  --daemon-arg ARG  one more flag for every gradsyncd started (repeatable), e.g.\n"
    "                 --daemon-arg=--etcd-tls-ca=/etc/etcd/ca.pem\n";

bool parse(int argc, char** argv, DemoOptions* o, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        *error = std::string(name) + " needs a value";
        return nullptr;
      }
      return argv[++i];
    };
    auto number = [&](const char* name, int* out, int min, int max) {
      const char* v = value(name);
      if (!v) return false;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end != '\0' || n < min || n > max) {
        *error = std::string(name) + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                 ", got '" + v + "'";
        return false;
      }
      *out = static_cast<int>(n);
      return true;
    };
    const char* v = nullptr;
    if (arg == "--help" || arg == "-h") o->help = true;
    else if (arg == "--clients") { if (!number("--clients", &o->clients, 1, 64)) return false; }
    else if (arg == "--steps") { if (!number("--steps", &o->steps, 1, 1000000)) return false; }
    else if (arg == "--nodes") { if (!number("--nodes", &o->nodes, 1, 128)) return false; }
    else if (arg == "--trainer") { if (!number("--trainer", &o->trainer_rank, 0, 1023)) return false; }
    else if (arg == "--rendezvous") { if (!(v = value("--rendezvous"))) return false; o->rendezvous = v; }
    else if (arg == "--model") { if (!(v = value("--model"))) return false; o->model = v; }
    else if (arg == "--socket") { if (!(v = value("--socket"))) return false; o->socket = v; }
    else if (arg == "--daemon") { if (!(v = value("--daemon"))) return false; o->daemon = v; }
    else if (arg == "--job") { if (!(v = value("--job"))) return false; o->job = v; }
    else if (arg == "--daemon-arg") { if (!(v = value("--daemon-arg"))) return false; o->daemon_args.push_back(v); }
    else if (arg.rfind("--daemon-arg=", 0) == 0) o->daemon_args.push_back(arg.substr(13));
    else {
      *error = "unknown argument '" + arg + "'";
      return false;
    }
  }
  return true;
}

// Gradient of element i of tensor t on `rank` at `step`: (rank + 1) * k with k in 1..7. The
// average over N ranks is k * (N + 1) / 2, exact in float32.
inline float gradient(int rank, uint64_t t, uint64_t i, int step) {
  return static_cast<float>(rank + 1) * static_cast<float>((i + t * 3 + static_cast<uint64_t>(step)) % 7 + 1);
}

int run_trainer(const DemoOptions& o) {
  const int rank = o.trainer_rank;
  const int world = o.clients * o.nodes;
  auto client = Client::connect(ConnectOptions{o.socket, "gradsync-demo rank " + std::to_string(rank)});
  JoinOptions join{o.job, rank, world, rank % o.clients, o.clients, std::chrono::milliseconds(0)};
  join.rendezvous = o.rendezvous;
  client->join(join);
  const std::vector<TensorSpec> specs = model_layout(o.model);
  const std::vector<SharedTensor> grads = client->allocate_flat(specs);
  const TensorSet set = client->register_tensors(grads, RegisterOptions{});
  // A one-element set used as a barrier, so each step's timing starts when every trainer is ready.
  const std::vector<SharedTensor> token = {client->allocate(TensorSpec{DType::kFloat32, 1, "dp"})};
  const TensorSet barrier = client->register_tensors(token, RegisterOptions{});

  uint64_t params = 0;
  for (const auto& t : grads) params += t.numel();
  const double bytes = static_cast<double>(params) * sizeof(float);
  const float mean_factor = static_cast<float>(world + 1) / 2.0f;
  std::vector<double> step_ms;
  for (int step = 0; step < o.steps; ++step) {
    for (uint64_t t = 0; t < grads.size(); ++t) {
      auto values = grads[t].as<float>();
      for (uint64_t i = 0; i < values.size(); ++i) values[i] = gradient(rank, t, i, step);
    }
    if (!client->allreduce(barrier, ReduceOptions{ReduceOp::kSum}).wait(client->job_timeout())) {
      std::fprintf(stderr, "rank %d: step %d: barrier timed out\n", rank, step);
      return 1;
    }
    const auto start = std::chrono::steady_clock::now();
    Work work = client->allreduce_deferred(set, ReduceOptions{});
    for (size_t t = grads.size(); t-- > 0;) client->mark_ready(set, static_cast<uint32_t>(t));
    if (!work.wait(client->job_timeout())) {
      std::fprintf(stderr, "rank %d: step %d: allreduce timed out\n", rank, step);
      return 1;
    }
    step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    for (uint64_t t = 0; t < grads.size(); ++t) {
      auto values = grads[t].as<float>();
      for (uint64_t i = 0; i < values.size(); ++i) {
        const float expected = static_cast<float>((i + t * 3 + static_cast<uint64_t>(step)) % 7 + 1) * mean_factor;
        if (values[i] != expected) {
          std::fprintf(stderr, "rank %d: step %d: MISMATCH tensor %llu element %llu: got %.9g, expected %.9g\n", rank,
                       step, static_cast<unsigned long long>(t), static_cast<unsigned long long>(i), values[i],
                       expected);
          return 3;
        }
      }
    }
  }
  if (rank == 0) {
    std::vector<double> sorted = step_ms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    size_t zero_copy = 0;
    for (const auto& b : set.buckets()) zero_copy += b.zero_copy;
    std::printf("model %s: %zu tensors, %llu parameters (%.1f MiB float32), %zu buckets (%zu in place)\n",
                o.model.c_str(), grads.size(), static_cast<unsigned long long>(params), bytes / (1 << 20),
                set.buckets().size(), zero_copy);
    std::printf("%d node(s) x %d clients x %d steps: allreduce(avg) median %.2f ms per step (min %.2f, max %.2f), "
                "%.2f GB/s per client\n",
                o.nodes, o.clients, o.steps, median, sorted.front(), sorted.back(), bytes / (median / 1e3) / 1e9);
  }
  return 0;
}

int run_demo(const DemoOptions& o) {
  if (!o.socket.empty() && o.nodes > 1) {
    std::fprintf(stderr, "gradsync-demo: --socket and --nodes do not combine: --nodes starts its own daemons\n");
    return 2;
  }
  if (!o.rendezvous.empty() && o.nodes < 2) {
    std::fprintf(stderr, "gradsync-demo: --rendezvous takes --nodes 2 or more: one node needs no rendezvous\n");
    return 2;
  }
  // One daemon per simulated node; node 0's peer service is the rendezvous unless one is given.
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  std::vector<std::string> sockets;
  std::string rendezvous = o.rendezvous;
  ClusterToken token;  // the nodes' peer services accept only each other
  if (o.socket.empty()) {
    for (int n = 0; n < o.nodes; ++n) {
      std::string listen = "127.0.0.1:0";
      if (n == 0 && o.nodes > 1 && o.rendezvous.empty()) {
        rendezvous = "127.0.0.1:" + std::to_string(free_loopback_port());
        listen = rendezvous;
      }
      std::vector<std::string> args = {"--log-level", "warning", "--peer-listen", listen, "--peer-token-file",
                                       token.path()};
      args.insert(args.end(), o.daemon_args.begin(), o.daemon_args.end());
      daemons.push_back(std::make_unique<DaemonProcess>(DaemonProcess::Options{o.daemon, args, ""}));
      sockets.push_back(daemons.back()->socket_path());
      std::printf("gradsyncd (node %d) started on %s\n", n, sockets.back().c_str());
    }
    std::fflush(stdout);
  } else {
    sockets.push_back(o.socket);
  }
  const std::string job = o.job + "-" + std::to_string(::getpid());
  const int world = o.clients * o.nodes;
  std::vector<ChildProcess> trainers;
  const std::string self = executable_directory() + "/gradsync-demo";
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {self, "--trainer", std::to_string(r), "--clients", std::to_string(o.clients),
                                     "--nodes", std::to_string(o.nodes), "--steps", std::to_string(o.steps),
                                     "--model", o.model, "--socket", sockets[static_cast<size_t>(r / o.clients)],
                                     "--job", job};
    if (!rendezvous.empty()) argv.insert(argv.end(), {"--rendezvous", rendezvous});
    trainers.emplace_back(argv);
  }
  int failures = 0;
  for (int r = 0; r < world; ++r) {
    const int status = trainers[static_cast<size_t>(r)].wait_for(std::chrono::hours(24));
    if (!exited_ok(status)) {
      std::fprintf(stderr, "trainer rank %d %s\n", r, describe_wait_status(status).c_str());
      failures++;
    }
  }
  for (auto& daemon : daemons) {
    const int status = daemon->terminate();
    if (!exited_ok(status)) {
      std::fprintf(stderr, "gradsyncd %s\n", describe_wait_status(status).c_str());
      failures++;
    }
  }
  if (failures) {
    std::printf("FAILED: %d processes did not finish cleanly\n", failures);
    return 1;
  }
  std::printf("verified: %d node(s) x %d clients x %d steps, every element of every step matched the exact average\n",
              o.nodes, o.clients, o.steps);
  return 0;
}

}  // namespace
}  // namespace gradsync

int main(int argc, char** argv) {
  gradsync::DemoOptions options;
  std::string error;
  if (!gradsync::parse(argc, argv, &options, &error)) {
    std::fprintf(stderr, "gradsync-demo: %s\n%s", error.c_str(), gradsync::kUsage);
    return 2;
  }
  if (options.help) {
    std::printf("%s", gradsync::kUsage);
    return 0;
  }
  try {
    return options.trainer_rank >= 0 ? gradsync::run_trainer(options) : gradsync::run_demo(options);
  } catch (const gradsync::Error& e) {
    std::fprintf(stderr, "gradsync-demo%s: %s\n",
                 options.trainer_rank >= 0 ? (" rank " + std::to_string(options.trainer_rank)).c_str() : "", e.what());
    return 1;
  }
}
