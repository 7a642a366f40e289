// The benchmark's trainer processes: real clients of a real gradsyncd, run as children of the
// bench (this binary with --role trainer). Rank 0 prints what it measured as lines
// "sample <us>" (one per timed step) and, in mark mode, "mark <us>" (the time spent in
// mark_ready per tensor, one per step), which the bench reads back.
#pragma once

#include <string>
#include <vector>

namespace gradsync::bench {

struct TrainerArgs {
  std::string socket;
  std::string job;
  std::string rendezvous;   // empty on one node
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  // flat:BYTES, resnet50, resnet50-flat, small:N:ELEMENTS, small-flat:N:ELEMENTS
  std::string layout = "flat:104857600";
  std::string dtype = "float32";  // float32, float16 or bfloat16 (flat layouts only)
  // step: allreduce(set) per step; mark: deferred + mark_ready each tensor; reduce_scatter:
  // reduce_scatter(set) per step; health: an allreduce with the fused health and a plain one
  // per step, in alternating order (rank 0 prints "plain <us>" beside each sample);
  // separate-health: allreduce, then the trainer's own pass over the results for inf, NaN and
  // the norm
  std::string mode = "step";
  // A mask keeping about this percentage of the set's elements (spread as a pruned model's
  // are); 0: no mask.
  int mask_percent = 0;
  // The step mode's ReduceOptions::wire_dtype: "" (none), "bfloat16" or "float16".
  std::string wire;
  int steps = 10;
  int warmup = 2;
  bool barrier = true;            // line the ranks up before every timed step
};

// The arguments after the binary that make a child run `args`.
std::vector<std::string> trainer_argv(const TrainerArgs& args);

// Parses one trainer flag at argv[i] (advancing i past its value); false when it is not one.
bool parse_trainer_flag(int argc, char** argv, int& i, TrainerArgs& args);

int run_trainer(const TrainerArgs& args);

}  // namespace gradsync::bench
