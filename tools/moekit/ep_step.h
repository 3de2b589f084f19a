// The workload of `moekit run --ep N`: one MoE layer (router → dispatch → grouped MLP → combine)
// on N CPU ranks or N GPUs (cuda: CudaRanks or NcclRanks over GPUs 0..N-1), forward + backward per
// step, timed by phase, with the bytes the transport moved
// and a check against the same layer on one rank over every rank's tokens (dense reference).
#pragma once

#include <cstdint>
#include <string>

#include "moekit/moekit.h"

namespace moekit::tools {

struct EpStepConfig {
  int ranks = 1;
  bool cuda = false;  // GPUs 0..ranks-1 (phases timed with a synchronisation each)
  std::string engine = "cpu-ranks";  // with cuda: "cuda-ranks" (CudaRanks) or "nccl-symmetric" (NcclRanks)
  int64_t hidden = 0, ffn = 0, experts = 0, tokens = 0,
          topk = 2;  // experts: E in all; tokens per rank
  DType dtype = DType::BF16;
  Recipe recipe = {};  // of the experts' MLP (each expert's rows padded to its multiple)
  uint64_t seed = 1;
  int64_t steps = 3;
  bool check = true;
};

struct EpStepReport {
  std::string preset;
  EpStepConfig cfg;
  // Medians over the timed steps of the slowest rank's time per phase (ms).
  double fwd_router = 0, fwd_dispatch = 0, fwd_mlp = 0, fwd_combine = 0;
  double bwd_combine = 0, bwd_mlp = 0, bwd_dispatch = 0, bwd_router = 0, step_ms = 0;
  // Bytes per rank (mean over ranks) of one step's dispatch and combine (forward).
  double dispatch_remote = 0, dispatch_local = 0, dispatch_per_slot = 0;
  double combine_remote = 0, combine_local = 0, combine_per_slot = 0;
  bool zero_copy = false;
  double staged_copy_ms = 0, staged_copy_bytes = 0;  // one copy of [R, H] the zero copy avoids
  bool checked = false, passed = false, bit_identical = false;
  double max_error = 0, tolerance = 0;
  std::string worst;
  std::string table() const;
  std::string json() const;
};

/// Runs the layer (throws moekit::Error when it cannot).
EpStepReport run_ep_step(const EpStepConfig& cfg, const std::string& preset);

}  // namespace moekit::tools
