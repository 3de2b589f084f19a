// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=small256): bf16 group-M fprop and dgrad for groups of few rows (kSmallM) on the
// ping-pong 64x256x64 tile (ConfigSmallWide, kernel_common.cuh). Their own translation unit, so
// they compile beside the other study TUs.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_small256, DType::BF16, true, ConfigSmallWide, None,
                             "bf16 b:k-major pingpong 64x256x64 cluster 1x1 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_small256, DType::BF16, false, ConfigSmallWide, None,
                             "bf16 b:n-major pingpong 64x256x64 cluster 1x1 (study)")
}  // namespace moekit::cuda::sm90
