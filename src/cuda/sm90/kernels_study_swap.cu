// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=swap, swap21): kSmallM's plain bf16 fprop and dgrad with A and B swapped on the
// cooperative 256x64 tile (ConfigSwapSmall, kernel_common.cuh), with a 1x1 and a 2x1 cluster
// (ConfigSwapSmall21). Their own translation unit.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_swap, DType::BF16, true, ConfigSwapSmall, None,
                             "bf16 b:k-major swapped cooperative 256x64x64 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_swap, DType::BF16, false, ConfigSwapSmall, None,
                             "bf16 b:n-major swapped cooperative 256x64x64 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_swap21, DType::BF16, true, ConfigSwapSmall21, None,
                             "bf16 b:k-major swapped cooperative 256x64x64 2x1 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_swap21, DType::BF16, false, ConfigSwapSmall21, None,
                             "bf16 b:n-major swapped cooperative 256x64x64 2x1 (study)")
}  // namespace moekit::cuda::sm90
