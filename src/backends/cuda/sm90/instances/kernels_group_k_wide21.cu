// bf16 group-K (f32 and bf16 dw) on the cooperative 128x256 tile with a 2x1 cluster
// (ConfigWide21): the group-K of >= 2048 rows per group (heuristics.h; heuristics.cpp, instance).
#include "backends/cuda/sm90/kernel/group_k_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_f32_wide21, DType::BF16, DType::F32, ConfigWide21,
                             "bf16 -> f32 cooperative 128x256x64 cluster 2x1")
MOEKIT_SM90_GROUP_K_INSTANCE(group_k_bf16_bf16_wide21, DType::BF16, DType::BF16, ConfigWide21Epi64,
                             "bf16 -> bf16 cooperative 128x256x64 cluster 2x1, epilogue 128x64")
}  // namespace moekit::cuda::sm90
