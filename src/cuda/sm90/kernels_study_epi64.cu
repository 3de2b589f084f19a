// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=epi64): the plain bf16 instances of the cooperative 128x256 tile on a 128x64
// epilogue subtile (ConfigWideEpi64, ConfigWide21Epi64, kernel_common.cuh): kLarge's dgrad, the
// fprop of K >= 4096, and the bf16 -> bf16 group-K of >= 2048 rows per group.
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/group_k_kernel.cuh"
#include "cuda/sm90/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_wide21_epi64, DType::BF16, true, ConfigWide21Epi64, None,
                             "bf16 b:k-major cooperative 128x256x64 cluster 2x1, epilogue 128x64 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_wide_epi64, DType::BF16, false, ConfigWideEpi64, None,
                             "bf16 b:n-major cooperative 128x256x64 cluster 1x2, epilogue 128x64 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_wide21_epi64, DType::BF16, DType::BF16, ConfigWide21Epi64,
                             "bf16 -> bf16 cooperative 128x256x64 cluster 2x1, epilogue 128x64 (study)")
}  // namespace moekit::cuda::sm90
