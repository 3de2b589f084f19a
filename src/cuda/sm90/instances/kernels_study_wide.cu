// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=wide): bf16 group-M fprop on the cooperative 128x256x64 tile (ConfigWide,
// kernel_common.cuh; dgrad and the group-K of large groups are on it in every build:
// kernels_bf16.cu, kernels_group_k_wide.cu); and for
// MOEKIT_SM90_TILE=pingpong the bf16 dgrad on the ping-pong 128x128 tile (ConfigLarge). Their own translation unit,
// so they compile beside kernels_study.cu.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_wide, DType::BF16, true, ConfigWide, None,
                             "bf16 b:k-major cooperative 128x256x64 cluster 1x2 (study)")
// MOEKIT_SM90_TILE=pingpong: dgrad back on kLarge's ping-pong 128x128 (its tile until 3074b1d).
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_pingpong, DType::BF16, false, ConfigLarge, None,
                             "bf16 b:n-major pingpong 128x128x64 cluster 1x2 (study)")
}  // namespace moekit::cuda::sm90
