// The compiled block-scaled FP8 instances (kernel/fp8_kernel.cuh, fp8-block) for f16 layers:
// fprop, dgrad (e4m3 or e5m2 gradients) and a 16-bit wgrad writing f16 (main_grad: the f32
// instances of kernels_fp8_block_group_k.cu). A TU of their own, beside the bf16 ones.
#include "backends/cuda/sm90/kernel/fp8_kernel.cuh"

namespace moekit::cuda::sm90 {
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_block_group_m_fprop_f16, E4M3, E4M3, DType::F16, ConfigFp8Block, Fp8FpropBlockScales,
                                 "e4m3 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, 1x128 x 128x128 block scales")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_block_group_m_dgrad_e4m3_f16, E4M3, E4M3, DType::F16, ConfigFp8Block, Fp8DgradBlockScales,
                                 "e4m3 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, 1x128 x 128x128 block scales (Wt)")
MOEKIT_SM90_FP8_GROUP_M_INSTANCE(fp8_block_group_m_dgrad_e5m2_f16, E5M2, E4M3, DType::F16, ConfigFp8Block, Fp8DgradBlockScales,
                                 "e5m2 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, 1x128 x 128x128 block scales (Wt)")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_block_group_k_e4m3_f16, E4M3, E4M3, DType::F16, ConfigFp8Block, Fp8WgradBlockScales,
                                 "e4m3 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, 1x128 x 1x128 block scales")
MOEKIT_SM90_FP8_GROUP_K_INSTANCE(fp8_block_group_k_e5m2_f16, E5M2, E4M3, DType::F16, ConfigFp8Block, Fp8WgradBlockScales,
                                 "e5m2 x e4m3 -> f16 cooperative 128x128x128 cluster 1x2, 1x128 x 1x128 block scales")
}  // namespace moekit::cuda::sm90
