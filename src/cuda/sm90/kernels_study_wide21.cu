// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=wide21): bf16 dgrad and group-K (f32 and bf16 dw) on the cooperative
// 128x256x64 tile with a 2x1 cluster (ConfigWide21, kernel_common.cuh). Its fprop instances are
// in every build (kernels_fprop_wide21.cu); the fused SwiGLU backward is in
// kernels_study_wide21_fused.cu, so the two compile side by side.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_k_kernel.cuh"
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_wide21, DType::BF16, false, ConfigWide21, None,
                             "bf16 b:n-major cooperative 128x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_wide21, DType::BF16, DType::F32, ConfigWide21,
                             "bf16 -> f32 cooperative 128x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_wide21, DType::BF16, DType::BF16, ConfigWide21,
                             "bf16 -> bf16 cooperative 128x256x64 cluster 2x1 (study)")
}  // namespace moekit::cuda::sm90
