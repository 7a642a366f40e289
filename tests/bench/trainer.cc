#include "tests/bench/trainer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "client/tools/model_layouts.h"
#include "gradsync/client.h"

namespace gradsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  throw std::invalid_argument("unknown --dtype '" + name + "' (float32, float16 or bfloat16)");
}

// "small:N:ELEMENTS" -> {N, ELEMENTS}
std::pair<uint64_t, uint64_t> small_shape(const std::string& layout) {
  const auto first = layout.find(':');
  const auto second = layout.find(':', first + 1);
  if (second == std::string::npos) throw std::invalid_argument("layout '" + layout + "' is not small:N:ELEMENTS");
  return {std::stoull(layout.substr(first + 1, second - first - 1)), std::stoull(layout.substr(second + 1))};
}

std::vector<TensorSpec> layout_specs(const TrainerArgs& a) {
  const DType dtype = parse_dtype(a.dtype);
  if (a.layout.rfind("flat:", 0) == 0) {
    return {TensorSpec{dtype, std::stoull(a.layout.substr(5)) / dtype_size(dtype), "dp"}};
  }
  if (a.layout == "resnet50" || a.layout == "resnet50-flat") {
    std::vector<TensorSpec> specs = resnet50_layout();
    for (auto& s : specs) s.group = "dp";
    if (a.layout == "resnet50") return specs;
    uint64_t total = 0;
    for (const auto& s : specs) total += s.numel;
    return {TensorSpec{DType::kFloat32, total, "dp"}};
  }
  if (a.layout.rfind("small:", 0) == 0 || a.layout.rfind("small-flat:", 0) == 0) {
    const auto [n, elements] = small_shape(a.layout);
    if (a.layout.rfind("small:", 0) == 0) return std::vector<TensorSpec>(n, TensorSpec{dtype, elements, "dp"});
    return {TensorSpec{dtype, n * elements, "dp"}};
  }
  throw std::invalid_argument("unknown --layout '" + a.layout + "'");
}

// A trainer's own overflow check and norm over float32 results, as mixed-precision optimizers
// make it after the allreduce (the seeds' S15): every element read once more, squared and
// summed in float64 (eight lanes, vectorized), and checked for inf and NaN. -1 on one found.
double separate_health(const std::vector<SharedTensor>& tensors) {
  double lanes[8] = {};
  double bad = 0;
  for (const SharedTensor& t : tensors) {
    const std::span<const float> x = t.as<const float>();
    for (size_t i = 0; i + 8 <= x.size(); i += 8) {
      for (size_t j = 0; j < 8; ++j) {
        const double v = x[i + j];
        lanes[j] += v * v;
        bad += v - v;
      }
    }
  }
  double sum = 0;
  for (double l : lanes) sum += l;
  return bad == 0 ? sum : -1;
}

}  // namespace

std::vector<std::string> trainer_argv(const TrainerArgs& a) {
  std::vector<std::string> argv = {"--role", "trainer", "--socket", a.socket, "--job", a.job, "--rank",
                                   std::to_string(a.rank), "--world", std::to_string(a.world), "--local-rank",
                                   std::to_string(a.local_rank), "--local-world", std::to_string(a.local_world),
                                   "--layout", a.layout, "--dtype", a.dtype, "--mode", a.mode, "--steps",
                                   std::to_string(a.steps), "--warmup", std::to_string(a.warmup)};
  if (!a.rendezvous.empty()) argv.insert(argv.end(), {"--rendezvous", a.rendezvous});
  if (!a.barrier) argv.push_back("--no-barrier");
  if (a.mask_percent > 0) argv.insert(argv.end(), {"--mask-percent", std::to_string(a.mask_percent)});
  if (!a.wire.empty()) argv.insert(argv.end(), {"--wire", a.wire});
  return argv;
}

bool parse_trainer_flag(int argc, char** argv, int& i, TrainerArgs& a) {
  const std::string flag = argv[i];
  if (flag == "--no-barrier") {
    a.barrier = false;
    return true;
  }
  std::string* text = nullptr;
  int* number = nullptr;
  if (flag == "--socket") text = &a.socket;
  else if (flag == "--job") text = &a.job;
  else if (flag == "--rendezvous") text = &a.rendezvous;
  else if (flag == "--layout") text = &a.layout;
  else if (flag == "--dtype") text = &a.dtype;
  else if (flag == "--mode") text = &a.mode;
  else if (flag == "--wire") text = &a.wire;
  else if (flag == "--rank") number = &a.rank;
  else if (flag == "--world") number = &a.world;
  else if (flag == "--local-rank") number = &a.local_rank;
  else if (flag == "--local-world") number = &a.local_world;
  else if (flag == "--steps") number = &a.steps;
  else if (flag == "--warmup") number = &a.warmup;
  else if (flag == "--mask-percent") number = &a.mask_percent;
  else return false;
  if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
  const std::string value = argv[++i];
  if (text) *text = value;
  if (number) *number = std::atoi(value.c_str());
  return true;
}

int run_trainer(const TrainerArgs& a) {
  // Line by line: the bench reads the samples while the job runs (to see it warmed up).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto client = Client::connect(ConnectOptions{a.socket, "gradsync-bench"});
  JoinOptions join{a.job, a.rank, a.world, a.local_rank, a.local_world, std::chrono::milliseconds(0)};
  join.rendezvous = a.rendezvous;
  client->join(join);
  const std::vector<TensorSpec> specs = layout_specs(a);
  const std::vector<SharedTensor> tensors = client->allocate_flat(specs);
  const bool scatter = a.mode == "reduce_scatter";
  RegisterOptions options{.reduce_scatter = scatter};
  if (a.mask_percent > 0) {
    uint64_t elements = 0;
    for (const TensorSpec& spec : specs) elements += spec.numel;
    for (uint64_t i = 0; i < elements; ++i) {
      if ((i * 2654435761ull >> 11) % 100 < static_cast<uint64_t>(a.mask_percent)) options.mask.push_back(i);
    }
  }
  const TensorSet set = client->register_tensors(tensors, options);
  const std::vector<SharedTensor> token = {client->allocate(TensorSpec{DType::kFloat32, 1, "dp"})};
  const TensorSet barrier = client->register_tensors(token, {});
  const auto deadline = std::chrono::seconds(120);
  ReduceOptions step_options;
  if (!a.wire.empty()) step_options.wire_dtype = parse_dtype(a.wire);
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    if (a.barrier || i == 0) {
      if (!client->allreduce(barrier, ReduceOptions{ReduceOp::kSum}).wait(deadline)) return 1;
    }
    const auto start = Clock::now();
    double mark_us = 0;
    if (a.mode == "mark") {
      Work work = client->allreduce_deferred(set, ReduceOptions{});
      const auto marking = Clock::now();
      // Backward order, as autograd hooks fire.
      for (size_t t = specs.size(); t-- > 0;) client->mark_ready(set, static_cast<uint32_t>(t));
      mark_us = us_since(marking) / static_cast<double>(specs.size());
      if (!work.wait(deadline)) return 1;
    } else if (scatter) {
      if (!client->reduce_scatter(set, ReduceOptions{}).wait(deadline)) return 1;
    } else if (a.mode == "health") {
      // A plain allreduce and one with the fused health, back to back in alternating order,
      // each after its own barrier: both see the same moment of a noisy machine, so their
      // ratio holds where rows timed one after another swing by more than the 5% in question.
      const auto plain = [&] { return client->allreduce(set, ReduceOptions{}).wait(deadline); };
      const auto fused = [&] {
        ReduceOptions options;
        options.health = true;
        Work work = client->allreduce(set, options);
        return work.wait(deadline) && !work.found_inf();  // the bench's inputs are finite
      };
      double plain_us = 0;
      const auto timed_plain = [&] {
        if (!client->allreduce(barrier, ReduceOptions{ReduceOp::kSum}).wait(deadline)) return false;
        const auto from = Clock::now();
        const bool ok = plain();
        plain_us = us_since(from);
        return ok;
      };
      if (i % 2 == 1 && !timed_plain()) return 1;
      if (i % 2 == 1 && !client->allreduce(barrier, ReduceOptions{ReduceOp::kSum}).wait(deadline)) return 1;
      const auto from = Clock::now();
      if (!fused()) return 1;
      const double fused_us = us_since(from);
      if (i % 2 == 0 && !timed_plain()) return 1;
      if (a.rank == 0 && i >= a.warmup) std::printf("sample %.3f\nplain %.3f\n", fused_us, plain_us);
      continue;
    } else if (a.mode == "separate-health") {
      // What a trainer does without the fused check: a pass of its own over the results.
      if (!client->allreduce(set, ReduceOptions{}).wait(deadline)) return 1;
      if (separate_health(tensors) < 0) return 1;
    } else if (!client->allreduce(set, step_options).wait(deadline)) {
      return 1;
    }
    const double step_us = us_since(start);
    if (a.rank == 0 && i >= a.warmup) {
      std::printf("sample %.3f\n", step_us);
      if (a.mode == "mark") std::printf("mark %.4f\n", mark_us);
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace gradsync::bench
