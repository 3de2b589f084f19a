// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=pp64w21): bf16 group-M (fprop and dgrad) and group-K (f32 and bf16 dw) on the
// ping-pong 64x256x64 tile with a 2x1 cluster (ConfigPingPong64W21, kernel_common.cuh). The fused
// SwiGLU instances are in kernels_study_pp64w21_fused.cu, so the two compile side by side.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_k_kernel.cuh"
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_pp64w21, DType::BF16, true, ConfigPingPong64W21, None,
                             "bf16 b:k-major pingpong 64x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_pp64w21, DType::BF16, false, ConfigPingPong64W21, None,
                             "bf16 b:n-major pingpong 64x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_pp64w21, DType::BF16, DType::F32, ConfigPingPong64W21,
                             "bf16 -> f32 pingpong 64x256x64 cluster 2x1 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_pp64w21, DType::BF16, DType::BF16, ConfigPingPong64W21,
                             "bf16 -> bf16 pingpong 64x256x64 cluster 2x1 (study)")
}  // namespace moekit::cuda::sm90
