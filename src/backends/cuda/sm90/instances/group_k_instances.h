// Internal: the compiled instances of the sm90 group-K grouped GEMM (the weight gradient), defined
// in kernels_bf16.cu and kernels_f16.cu and picked by heuristics.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"

namespace moekit::cuda::sm90 {

struct GroupKInstance {
  const char* name;  // "bf16 -> f32 pingpong 128x128x64 cluster 1x2"
  size_t (*workspace_bytes)(const GroupKProblem& p);
  void (*run)(const GroupKProblem& p, void* workspace, cudaStream_t stream);
  // Whether p's groups have fewer tiles on this instance than its persistent grid has CTAs.
  bool (*groups_below_grid)(const GroupKProblem& p);
};

// [dtype][dw: 0 f32, 1 the input dtype]
extern const GroupKInstance group_k_bf16_f32, group_k_bf16_bf16, group_k_f16_f32, group_k_f16_f16;
// bf16 on the cooperative 128x256 tile with a 2x1 cluster, for groups of >= 2048 rows on average
// (kernels_group_k_wide21.cu).
extern const GroupKInstance group_k_bf16_f32_wide21, group_k_bf16_bf16_wide21;
// bf16 -> bf16 on the own ping-pong kernel, for small groups of < 1024 rows on average (kernels_group_k_own.cu).
extern const GroupKInstance group_k_bf16_bf16_own;

}  // namespace moekit::cuda::sm90
