// The workload of `moekit run`: one expert layer of a rank, its data, one training step, and an
// fp64 check of that step on sampled rows and weight-gradient entries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit::tools {

struct StepConfig {
  int64_t hidden = 0, ffn = 0, experts = 0, tokens = 0, tail = 0;
  bool skewed = false;
  DType dtype = DType::BF16;
  uint64_t seed = 1;
  bool fuse = true;  // let Sequential fuse fc1 → ScaledSwiGLU → fc2 into GroupedMLP
  bool host_splits = false;     // counts as a host vector instead of a device tensor
  bool caller_buffers = true;   // y and dx into caller buffers (false: the ops allocate them)
  // Gate/linear column layout of h. Interleaved32 (default) is the one whose SwiGLU the GPU fuses
  // into fc1's GEMM epilogue (grouped_gemm_swiglu); Halves runs the SwiGLU kernel after the GEMM.
  GluLayout glu = GluLayout::Interleaved32;
  // Quantized recipe of fc1 and fc2 (SPEC §6; --recipe). With one, each expert's rows are padded
  // up to the recipe's row multiple (as TE's Fp8Padding) and the ops run unfused.
  Recipe recipe = {};
};

struct CheckResult {
  bool passed = false;
  double max_error = 0, tolerance = 0;  // max |out - ref| / max |ref| per checked quantity
  int rows_checked = 0, grad_entries_checked = 0;
  bool tails_intact = false;
  std::string worst;  // which quantity had the largest error
};

struct StepReport {
  std::string layer, preset, routing, device, dtype, shapes, splits_kind, glu, recipe;
  int64_t experts = 0, tokens = 0, tail = 0, min_rows = 0, max_rows = 0, empty_experts = 0;
  int64_t hidden = 0, ffn = 0;
  bool fused = true, host_splits = false, caller_buffers = true;
  std::vector<int64_t> counts;  // rows per expert (bench/mlp_peer.py replays them in torch)
  double step_ms = 0, gflop = 0;
  double enqueue_ms = 0;  // host time to queue one step's work (median)
  bool output_aliased = false, grad_input_aliased = false, checked = false;
  CheckResult check;
  std::string table() const;
  std::string json() const;
};

class ExpertStep {
 public:
  ExpertStep(const StepConfig& cfg, const Context& ctx);
  ~ExpertStep();
  /// Forward + backward, output and input gradient written into the caller-owned buffers.
  void run_once();
  CheckResult check() const;
  StepReport report(double step_ms, const std::string& preset, const std::string& routing,
                    const CheckResult& check, bool checked) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace moekit::tools
