// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=pp22): bf16 group-M (fprop and dgrad) and group-K (f32 and bf16 dw) on the
// ping-pong 128x128x64 tile with a 2x2 cluster (ConfigLarge22, kernel_common.cuh). The fused
// SwiGLU instances are in kernels_study_pp22_fused.cu, so the two compile side by side.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_k_kernel.cuh"
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_pp22, DType::BF16, true, ConfigLarge22, None,
                             "bf16 b:k-major pingpong 128x128x64 cluster 2x2 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_pp22, DType::BF16, false, ConfigLarge22, None,
                             "bf16 b:n-major pingpong 128x128x64 cluster 2x2 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_pp22, DType::BF16, DType::F32, ConfigLarge22,
                             "bf16 -> f32 pingpong 128x128x64 cluster 2x2 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_pp22, DType::BF16, DType::BF16, ConfigLarge22,
                             "bf16 -> bf16 pingpong 128x128x64 cluster 2x2 (study)")
}  // namespace moekit::cuda::sm90
