// The compiled block-scaled FP8 group-K instances (kernel/fp8_kernel.cuh, fp8-block): the weight
// gradient from the columnwise copies' 1x128 blocks on both sides, an f32 (main_grad) or bf16 dw.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_block_group_k_e4m3_f32, E4M3, E4M3, DType::F32, ConfigFp8Block, Fp8WgradBlockScales,
                                 "e4m3 x e4m3 -> f32 cooperative 128x128x128 cluster 1x2, 1x128 x 1x128 block scales")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_block_group_k_e4m3_bf16, E4M3, E4M3, DType::BF16, ConfigFp8Block, Fp8WgradBlockScales,
                                 "e4m3 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, 1x128 x 1x128 block scales")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_block_group_k_e5m2_f32, E5M2, E4M3, DType::F32, ConfigFp8Block, Fp8WgradBlockScales,
                                 "e5m2 x e4m3 -> f32 cooperative 128x128x128 cluster 1x2, 1x128 x 1x128 block scales")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_block_group_k_e5m2_bf16, E5M2, E4M3, DType::BF16, ConfigFp8Block, Fp8WgradBlockScales,
                                 "e5m2 x e4m3 -> bf16 cooperative 128x128x128 cluster 1x2, 1x128 x 1x128 block scales")
}  // namespace moekit::cuda::sm90
