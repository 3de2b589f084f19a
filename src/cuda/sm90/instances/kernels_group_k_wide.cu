// The bf16 group-K (weight gradient) instances on the cooperative 128x256x64 tile with a 1x2
// cluster (ConfigWide), for groups of >= 2048 rows on average (grouped_gemm_sm90.cpp, the
// group-K instance choice); MOEKIT_SM90_TILE=wide (study build) puts every bf16 group-K on them.
// Their own translation unit, so they compile beside kernels_bf16.cu.
#include "cuda/sm90/kernel/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_wide, DType::BF16, DType::F32, ConfigWide,
                             "bf16 -> f32 cooperative 128x256x64 cluster 1x2")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_wide, DType::BF16, DType::BF16, ConfigWide,
                             "bf16 -> bf16 cooperative 128x256x64 cluster 1x2")
}  // namespace moekit::cuda::sm90
