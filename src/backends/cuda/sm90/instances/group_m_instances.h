// Internal: the compiled instances of the sm90 group-M grouped GEMM, defined in kernels_bf16.cu
// and kernels_f16.cu (four per translation unit) and picked by heuristics.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/cuda/sm90/device/grouped_gemm_sm90.h"

namespace moekit::cuda::sm90 {

struct GroupMInstance {
  const char* name;                                            // "bf16 b:k-major pingpong 128x128x64 cluster 1x2"
  size_t (*workspace_bytes)(const GroupMProblem& p);
  void (*run)(const GroupMProblem& p, void* workspace, cudaStream_t stream);
};

// [dtype][b layout][config]: b layout 0 = K-major (b_transposed, fprop), 1 = N-major (dgrad).
extern const GroupMInstance group_m_bf16_kmajor_large, group_m_bf16_kmajor_small,
    group_m_bf16_nmajor_large, group_m_bf16_nmajor_small, group_m_f16_kmajor_large,
    group_m_f16_kmajor_small, group_m_f16_nmajor_large, group_m_f16_nmajor_small;
// [dtype][config] with SwiGLU in the epilogue (GroupMProblem::glu_z; b K-major only).
extern const GroupMInstance group_m_bf16_swiglu_large, group_m_bf16_swiglu_small,
    group_m_f16_swiglu_large, group_m_f16_swiglu_small;
// [dtype][config] with the SwiGLU backward in the epilogue (GroupMProblem::dglu_dh; b N-major).
extern const GroupMInstance group_m_bf16_dswiglu_large, group_m_bf16_dswiglu_small,
    group_m_f16_dswiglu_large, group_m_f16_dswiglu_small;
// bf16 fprop of K >= 4096 on the cooperative 128x256 tile, cluster 2x1 (kernels_fprop_wide21.cu).
extern const GroupMInstance group_m_bf16_kmajor_wide21, group_m_bf16_swiglu_wide21;
// kSmallM's plain bf16 fprop and dgrad with A and B swapped, cooperative 256x64, cluster 2x1, for
// outputs whose columns fill 512-column slices (kernels_small_swap.cu).
extern const GroupMInstance group_m_bf16_kmajor_small_swap, group_m_bf16_nmajor_small_swap;

}  // namespace moekit::cuda::sm90
