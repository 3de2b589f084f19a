// Tile-study instances (built with -DMOEKIT_SM90_TILE_STUDY=ON only; chosen at run time with
// MOEKIT_SM90_TILE=coop): bf16 group-M (both B layouts) and group-K (f32 and bf16 dw) on the
// cooperative 256x128x64 tile (ConfigCoop, kernel_common.cuh); with MOEKIT_SM90_TILE=epi32, the
// bf16 group-K (both dw dtypes) on CUTLASS's automatic epilogue subtile (ConfigLargeEpi32). Their
// own translation unit, so a normal build compiles none of them. (The define makes
// group_{m,k}_instances.h declare these symbols extern here too; the rest of the library gets it
// from sources.cmake.)
#define MOEKIT_SM90_TILE_STUDY 1
#include "cuda/sm90/kernel/group_k_kernel.cuh"
#include "cuda/sm90/kernel/group_m_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_kmajor_coop, DType::BF16, true, ConfigCoop, None,
                             "bf16 b:k-major cooperative 256x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_M_INSTANCE(group_m_bf16_nmajor_coop, DType::BF16, false, ConfigCoop, None,
                             "bf16 b:n-major cooperative 256x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_coop, DType::BF16, DType::F32, ConfigCoop,
                             "bf16 -> f32 cooperative 256x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_coop, DType::BF16, DType::BF16, ConfigCoop,
                             "bf16 -> bf16 cooperative 256x128x64 cluster 1x2 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_epi32, DType::BF16, DType::BF16, ConfigLargeEpi32,
                             "bf16 -> bf16 ping-pong 128x128x64 cluster 1x2, epilogue 64x32 (study)")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_epi32, DType::BF16, DType::F32, ConfigLargeEpi32,
                             "bf16 -> f32 ping-pong 128x128x64 cluster 1x2, epilogue 64x32 (study)")
}  // namespace moekit::cuda::sm90
